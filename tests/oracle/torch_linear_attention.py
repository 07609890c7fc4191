#!/usr/bin/env python3
"""PyTorch oracle for corelm's log-decay linear attention (ops::linear_attention).

The op written as the naive per-token recurrence, one step at a time with torch autograd (f32):
    S_t = diag(exp(a_g)) S_{t-1} + k_t v_t^T   (zeroed before t when doc_ids[t] != doc_ids[t-1])
    o_t = scale * S_t^T q_t                     (query head h reads kv head h // (Hq // Hkv))
Seeded inputs, an upstream gradient, the output, the final state and the gradients of q, k, v
and log_decay go as JSON to the path given on the command line;
tests/oracle/test_linear_attention_oracle.cc runs the corelm op on the same inputs.

Usage: torch_linear_attention.py OUT.json
"""
import sys

from oracle_fixture import import_torch, tensor_json, write_json

torch = import_torch()


def recurrence(q, k, v, log_decay, doc_ids, init, scale):
    b, hq, t_len, _ = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    decay = torch.exp(log_decay)[None, :, :, None]  # [1, Hkv, d_s, 1]
    state = init.clone() if init is not None else q.new_zeros(b, hkv, q.shape[3], v.shape[3])
    outs = []
    for t in range(t_len):
        carried = decay * state
        if doc_ids is not None and t > 0:
            same = (doc_ids[:, t] == doc_ids[:, t - 1]).to(q.dtype)[:, None, None, None]
            carried = carried * same
        state = carried + k[:, :, t, :, None] * v[:, :, t, None, :]
        per_head = state.repeat_interleave(group, dim=1)  # [B, Hq, d_s, d_v]
        outs.append(scale * torch.einsum("bhc,bhcj->bhj", q[:, :, t], per_head))
    return torch.stack(outs, dim=2), state


def make_case(name, b, hq, hkv, t_len, ds, dv, seed, boundaries=None, with_init=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, t_len, ds, generator=g) * 0.3
    k = torch.randn(b, hkv, t_len, ds, generator=g) * 0.3
    v = torch.randn(b, hkv, t_len, dv, generator=g)
    # Decays from fast (-5) to nearly none (-0.001), log-uniform.
    log_decay = -torch.exp(torch.rand(hkv, ds, generator=g) * 8.5 - 6.9)
    init = torch.randn(b, hkv, ds, dv, generator=g) if with_init else None
    doc_ids = None
    if boundaries:
        doc_ids = torch.zeros(b, t_len, dtype=torch.int64)
        for pos in boundaries:
            doc_ids[:, pos:] += 1
    upstream = torch.randn(b, hq, t_len, dv, generator=g)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, log_decay)]
    out, final = recurrence(*leaves, doc_ids, init, scale)
    out.backward(upstream)
    return {
        "name": name, "scale": scale,
        "inputs": [tensor_json(x) for x in (q, k, v, log_decay)],
        "doc_ids": tensor_json(doc_ids), "initial_state": tensor_json(init),
        "upstream": tensor_json(upstream), "output": tensor_json(out), "final_state": tensor_json(final),
        "grads": [tensor_json(x.grad) for x in leaves],
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    cases = [
        make_case("gqa_t300", 1, 2, 1, 300, 32, 32, seed=1),
        make_case("gqa_t300_doc_ids", 1, 2, 1, 300, 32, 32, seed=2, boundaries=[50, 64, 130, 131, 255]),
        make_case("mha_init_scale", 2, 2, 2, 70, 8, 4, seed=3, with_init=True, scale=0.5),
    ]
    write_json(sys.argv[1], {"torch_version": torch.__version__, "cases": cases})
    print(f"torch_linear_attention: {len(cases)} cases -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
