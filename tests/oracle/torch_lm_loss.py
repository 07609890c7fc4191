#!/usr/bin/env python3
"""PyTorch oracle for corelm's fused LM-head losses (src/ops/linear_cross_entropy.cc).

Seeded hidden [N, H], weight [V, H] and targets (some -100) go through
F.cross_entropy(hidden @ weight.T, targets) (the full softmax) and through the sampled softmax
F.cross_entropy(hidden @ weight[cand].T - log_correction, position of the target in cand); the
losses and the gradients of hidden and weight are written as JSON to the path given on the
command line. tests/oracle/test_lm_loss_oracle.cc runs corelm's ops on the same inputs.

Usage: torch_lm_loss.py OUT.json
"""
import sys

from oracle_fixture import import_torch, tensor_json, write_json

torch = import_torch()
F = torch.nn.functional


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(2024)
    n, h, v = 600, 32, 300  # 600 rows: two full 256-row chunks and a ragged one
    hidden = torch.randn(n, h)
    weight = torch.randn(v, h) * 0.5
    targets = torch.randint(0, v, (n,))
    targets[3::11] = -100
    # Sampled: every non-ignored target plus 40 other ids, with a made-up correction.
    kept = targets[targets != -100]
    extra = torch.randperm(v)[:40]
    cand = torch.unique(torch.cat([kept, extra]))  # sorted
    log_correction = -torch.rand(len(cand)) * 3
    position = torch.full_like(targets, -100)
    mask = targets != -100
    position[mask] = torch.searchsorted(cand, targets[mask])

    cases = []
    for name in ("full", "sampled"):
        hd = hidden.clone().requires_grad_(True)
        wt = weight.clone().requires_grad_(True)
        if name == "full":
            loss = F.cross_entropy(hd @ wt.T, targets, ignore_index=-100)
        else:
            loss = F.cross_entropy(hd @ wt[cand].T - log_correction, position, ignore_index=-100)
        loss.backward()
        cases.append({"name": name, "loss": loss.item(), "grad_hidden": tensor_json(hd.grad),
                      "grad_weight": tensor_json(wt.grad)})
    write_json(sys.argv[1], {
        "torch_version": torch.__version__,
        "hidden": tensor_json(hidden), "weight": tensor_json(weight), "targets": tensor_json(targets),
        "candidates": tensor_json(cand), "log_correction": tensor_json(log_correction),
        "cases": cases,
    })
    print(f"torch_lm_loss: {len(cases)} cases -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
