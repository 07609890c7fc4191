#!/usr/bin/env python3
"""PyTorch oracle for corelm's optimizers (src/train/optimizer.cc).

Seeded parameters and a fixed sequence of 10 gradients per parameter go through torch.optim.SGD
and torch.optim.AdamW; the parameters after every step are written as JSON to the path given on
the command line. tests/oracle/test_optim_oracle.cc replays the same gradients through
corelm::optim and compares after each step. Case names must match the C++ table.

Usage: torch_optim.py OUT.json
"""
import sys

from oracle_fixture import import_torch, tensor_json, write_json

torch = import_torch()

STEPS = 10
SHAPES = [(4, 3), (5,), (2, 2, 3)]


def run(make_optimizer, params, grads):
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = make_optimizer(ps)
    after = []
    for step_grads in grads:
        for p, g in zip(ps, step_grads):
            p.grad = g.clone()
        opt.step()
        after.append([tensor_json(p) for p in ps])
    return after


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(4321)
    params = [torch.randn(s) for s in SHAPES]
    grads = [[torch.randn(s) for s in SHAPES] for _ in range(STEPS)]
    sgd, adamw = torch.optim.SGD, torch.optim.AdamW
    # name -> (options as corelm names them, torch constructor)
    cases = {
        "sgd": ({"lr": 0.1}, lambda ps: sgd(ps, lr=0.1)),
        "sgd_momentum_wd": ({"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
                            lambda ps: sgd(ps, lr=0.05, momentum=0.9, weight_decay=0.01)),
        "sgd_nesterov_wd": ({"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True},
                            lambda ps: sgd(ps, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)),
        "sgd_dampening": ({"lr": 0.05, "momentum": 0.8, "dampening": 0.3},
                          lambda ps: sgd(ps, lr=0.05, momentum=0.8, dampening=0.3)),
        "adamw": ({"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1},
                  lambda ps: adamw(ps, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)),
        "adamw_torch_defaults": ({"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                                    "weight_decay": 1e-2},
                                   lambda ps: adamw(ps, lr=1e-3)),
        # Per-parameter decay (e.g. none on norms): param 1 sits in a group with weight_decay 0.
        "adamw_no_decay_on_param_1": (
            {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-6, "weight_decay": 0.1,
             "no_decay_params": [1]},
            lambda ps: adamw([{"params": [ps[0], ps[2]]}, {"params": [ps[1]], "weight_decay": 0.0}],
                             lr=1e-2, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)),
    }
    fixture = {
        "torch_version": torch.__version__,
        "params": [tensor_json(p) for p in params],
        "grads": [[tensor_json(g) for g in step] for step in grads],
        "cases": [{"name": name, "options": options, "after": run(make, params, grads)}
                  for name, (options, make) in cases.items()],
    }
    write_json(sys.argv[1], fixture)
    print(f"torch_optim: {len(cases)} cases x {STEPS} steps -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
