#!/usr/bin/env python3
"""PyTorch oracle for the ops of include/corelm/ops.h.

For every case: seeded f32 inputs, the PyTorch forward, a random upstream gradient of the
output's shape and the input gradients from backward. Written as JSON to the path given on the
command line; tests/oracle/test_op_oracle.cc runs our ops on the same inputs and compares.
Case names must match the C++ table kCases (the C++ test checks that both sides agree).

Usage: torch_ops.py OUT.json
"""
import math
import sys

from oracle_fixture import import_torch, tensor_json, write_json

torch = import_torch()
F = torch.nn.functional


def rms_norm(x, w, eps):
    # Llama/Qwen RMSNorm, in f32.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta, offset):
    # HF Llama rotate_half formulation; pairs (i, i + D/2) share angle pos * inv_freq[i].
    d = x.shape[-1]
    t = x.shape[-2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
    pos = torch.arange(offset, offset + t).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * emb.cos() + rotated * emb.sin()


def causal_attention(q, k, v, scale=None):
    # Grouped-query heads: query head h reads kv head h // (Hq / Hkv). Query t sits at absolute
    # position S - T + t and sees keys 0 .. S - T + t.
    hq, t, d = q.shape[1], q.shape[2], q.shape[3]
    hkv, s = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    query_pos = torch.arange(t)[:, None] + (s - t)
    key_pos = torch.arange(s)[None, :]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    return scores.softmax(dim=-1) @ v


def sum_to(g, shape):
    # Inverse of broadcasting: sum leading extra dims, then dims where the target has size 1.
    lead = g.dim() - len(shape)
    if lead:
        g = g.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(dim=dims, keepdim=True) if dims else g


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float32)


def positive(*shape):
    return torch.rand(*shape, dtype=torch.float32) + 0.5


def ids(high, *shape, dtype=torch.int64):
    return torch.randint(0, high, shape, dtype=dtype)


def targets_with_ignored(n, v, ignore_index, ignored, dtype=torch.int64):
    t = torch.randint(0, v, (n,), dtype=dtype)
    t[list(ignored)] = ignore_index
    return t


def cases():
    """(name, fn, inputs): fn maps the inputs (floats require grad) to one output tensor."""
    return [
        # ---- shape ops ----
        ("reshape", lambda x: x.reshape(4, 6), [randn(2, 3, 4)]),
        ("reshape_of_transposed", lambda x: x.transpose(0, 1).reshape(12), [randn(3, 4)]),
        ("transpose", lambda x: x.transpose(1, 2), [randn(2, 3, 4)]),
        ("permute", lambda x: x.permute(2, 0, 3, 1), [randn(2, 3, 4, 5)]),
        ("slice", lambda x: x[1:3], [randn(4, 6)]),
        ("slice_step", lambda x: x[:, 1:5:2], [randn(4, 6)]),
        ("contiguous_of_transposed", lambda x: x.transpose(0, 1).contiguous(), [randn(3, 4)]),
        ("concat_dim1", lambda a, b, c: torch.cat([a, b, c], dim=1),
         [randn(2, 3), randn(2, 1), randn(2, 4)]),
        ("concat_dim0", lambda a, b: torch.cat([a, b], dim=0), [randn(2, 3, 2), randn(1, 3, 2)]),
        ("sum_to", lambda g: sum_to(g, (3, 1)), [randn(2, 3, 4)]),
        # ---- elementwise, with broadcasting ----
        ("add", lambda a, b: a + b, [randn(2, 3, 4), randn(2, 3, 4)]),
        ("add_broadcast", lambda a, b: a + b, [randn(2, 3, 4), randn(3, 1)]),
        ("sub_broadcast", lambda a, b: a - b, [randn(4), randn(2, 1, 4)]),
        ("mul", lambda a, b: a * b, [randn(2, 3, 4), randn(2, 3, 4)]),
        ("mul_broadcast", lambda a, b: a * b, [randn(2, 3, 4), randn(4)]),
        ("mul_transposed_input", lambda a, b: a.transpose(0, 1) * b, [randn(4, 3), randn(3, 4)]),
        ("div", lambda a, b: a / b, [randn(2, 3, 4), positive(2, 3, 4)]),
        ("div_broadcast", lambda a, b: a / b, [randn(2, 3, 4), positive(2, 1, 1)]),
        ("scale", lambda x: x * 0.7, [randn(2, 3, 4)]),
        ("add_scalar", lambda x: x + (-1.3), [randn(2, 3, 4)]),
        ("neg", lambda x: -x, [randn(2, 3, 4)]),
        ("exp", lambda x: x.exp(), [randn(2, 3, 4)]),
        ("log", lambda x: x.log(), [positive(2, 3, 4)]),
        ("sqrt", lambda x: x.sqrt(), [positive(2, 3, 4)]),
        ("square", lambda x: x.square(), [randn(2, 3, 4)]),
        # ---- reductions ----
        ("sum_all", lambda x: x.sum(), [randn(2, 3, 4)]),
        ("sum_dims_0_2", lambda x: x.sum(dim=(0, 2)), [randn(2, 3, 4)]),
        ("sum_last_keepdim", lambda x: x.sum(dim=-1, keepdim=True), [randn(2, 3, 4)]),
        ("mean_all", lambda x: x.mean(), [randn(2, 3, 4)]),
        ("mean_dim1", lambda x: x.mean(dim=1), [randn(2, 3, 4)]),
        ("mean_dims_0_2_keepdim", lambda x: x.mean(dim=(0, 2), keepdim=True), [randn(2, 3, 4)]),
        # ---- matmul / linear ----
        ("matmul", lambda a, b: a @ b, [randn(3, 4), randn(4, 5)]),
        ("matmul_transpose_a", lambda a, b: a.transpose(-1, -2) @ b, [randn(4, 3), randn(4, 5)]),
        ("matmul_transpose_b", lambda a, b: a @ b.transpose(-1, -2), [randn(3, 4), randn(5, 4)]),
        ("matmul_transpose_ab", lambda a, b: a.transpose(-1, -2) @ b.transpose(-1, -2),
         [randn(4, 3), randn(5, 4)]),
        ("matmul_batch_broadcast", lambda a, b: a @ b, [randn(2, 1, 3, 4), randn(3, 4, 5)]),
        ("matmul_batch_broadcast_transpose_b", lambda a, b: a @ b.transpose(-1, -2),
         [randn(2, 3, 4), randn(1, 5, 4)]),
        ("matmul_of_transposed_view", lambda a, b: a.transpose(0, 1) @ b, [randn(4, 3), randn(4, 2)]),
        ("linear", lambda x, w, b: F.linear(x, w, b), [randn(2, 3, 4), randn(5, 4), randn(5)]),
        ("linear_no_bias", lambda x, w: F.linear(x, w), [randn(6, 4), randn(3, 4)]),
        # ---- embedding ----
        ("embedding", lambda w, i: F.embedding(i, w), [randn(10, 4), ids(10, 2, 5)]),
        ("embedding_i32", lambda w, i: F.embedding(i.long(), w),
         [randn(7, 3), ids(7, 6, dtype=torch.int32)]),
        # ---- activations ----
        ("silu", lambda x: F.silu(x), [randn(2, 3, 4)]),
        ("swiglu", lambda g, u: F.silu(g) * u, [randn(2, 3, 4), randn(2, 3, 4)]),
        ("softmax", lambda x: x.softmax(dim=-1), [randn(2, 3, 5)]),
        ("softmax_dim1", lambda x: x.softmax(dim=1), [randn(2, 3, 5)]),
        ("softmax_of_permuted", lambda x: x.permute(0, 2, 1).softmax(dim=-1), [randn(2, 3, 4)]),
        ("log_softmax", lambda x: x.log_softmax(dim=-1), [randn(2, 3, 5)]),
        ("log_softmax_dim0", lambda x: x.log_softmax(dim=0), [randn(4, 3)]),
        ("dropout_eval", lambda x: F.dropout(x, 0.5, training=False), [randn(2, 3)]),
        ("dropout_p0", lambda x: F.dropout(x, 0.0, training=True), [randn(2, 3)]),
        # ---- normalisation ----
        ("rms_norm", lambda x, w: rms_norm(x, w, 1e-6), [randn(2, 3, 8), randn(8)]),
        ("rms_norm_of_slice", lambda x, w: rms_norm(x[:, 1:4], w, 1e-5), [randn(2, 5, 8), randn(8)]),
        # ---- rotary embedding ----
        ("rope", lambda x: rope(x, 10000.0, 0), [randn(2, 3, 5, 8)]),
        ("rope_offset", lambda x: rope(x, 10000.0, 7), [randn(2, 3, 5, 8)]),
        ("rope_theta_1e6", lambda x: rope(x, 1e6, 3), [randn(1, 2, 4, 16)]),
        # ---- attention ----
        ("attention_gqa_t_lt_s", lambda q, k, v: causal_attention(q, k, v),
         [randn(2, 4, 5, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 8)]),
        ("attention_gqa_t_eq_s", lambda q, k, v: causal_attention(q, k, v),
         [randn(2, 4, 6, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 8)]),
        ("attention_mha_scale", lambda q, k, v: causal_attention(q, k, v, scale=0.3),
         [randn(1, 2, 4, 8), randn(1, 2, 4, 8), randn(1, 2, 4, 8)]),
        ("attention_single_query", lambda q, k, v: causal_attention(q, k, v),
         [randn(2, 4, 1, 8), randn(2, 1, 7, 8), randn(2, 1, 7, 8)]),
        # ---- losses ----
        ("cross_entropy", lambda x, t: F.cross_entropy(x, t, ignore_index=-100),
         [randn(6, 7), targets_with_ignored(6, 7, -100, [1, 4])]),
        ("cross_entropy_ignore_0_i32", lambda x, t: F.cross_entropy(x, t.long(), ignore_index=0),
         [randn(8, 5), targets_with_ignored(8, 5, 0, [0, 3, 7], dtype=torch.int32)]),
        ("cross_entropy_no_ignored", lambda x, t: F.cross_entropy(x, t),
         [randn(4, 9) * 3.0, ids(9, 4)]),
    ]


def run_case(name, fn, inputs):
    xs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*xs)
    upstream = torch.randn(out.shape, dtype=torch.float32)
    out.backward(upstream)
    return {
        "name": name,
        "inputs": [tensor_json(x) for x in inputs],
        "output": tensor_json(out),
        "upstream": tensor_json(upstream),
        "grads": [tensor_json(x.grad) if x.is_floating_point() else None for x in xs],
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(1234)
    fixture = {"torch_version": torch.__version__,
               "cases": [run_case(*case) for case in cases()]}
    write_json(sys.argv[1], fixture)
    print(f"torch_ops: {len(fixture['cases'])} cases -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
