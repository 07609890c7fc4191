#!/usr/bin/env python3
"""PyTorch oracle for bf16 compute in ops::matmul (corelm/autocast.h, kernels::gemm_bf16).

For every case: seeded f32 operands and transpose flags, the f32 product of the operands rounded
by torch to bfloat16 (`exact_of_rounded`: what corelm's contract promises, up to fp32 summation
order) and torch's own bf16 matmul (`torch_bf16`: torch.matmul on bfloat16 tensors, whose output
is itself rounded to bf16). Written as JSON to the path given on the command line;
tests/oracle/test_bf16_matmul_oracle.cc runs ops::matmul under bf16 compute on every kernel.

Usage: torch_bf16_matmul.py OUT.json
"""
import sys

from oracle_fixture import import_torch, tensor_json, write_json

torch = import_torch()

# (name, M, K, N, transpose_a, transpose_b): the training products of a linear layer and odd sizes.
CASES = [
    ("forward_x_wt", 37, 70, 19, False, True),
    ("grad_x_dy_w", 37, 19, 70, False, False),
    ("grad_w_dyt_x", 19, 37, 70, True, False),
    ("both_transposed", 33, 65, 17, True, True),
    ("odd_k_one_row", 1, 129, 300, False, True),
    ("long_k", 24, 600, 40, False, False),
]


def main():
    gen = torch.Generator().manual_seed(14)
    cases = []
    for name, m, k, n, ta, tb in CASES:
        a = torch.randn((k, m) if ta else (m, k), generator=gen)
        b = torch.randn((n, k) if tb else (k, n), generator=gen)
        oa = a.t() if ta else a
        ob = b.t() if tb else b
        rounded = oa.bfloat16().double() @ ob.bfloat16().double()
        cases.append({
            "name": name,
            "transpose_a": ta,
            "transpose_b": tb,
            "inputs": [tensor_json(a), tensor_json(b)],
            "exact_of_rounded": tensor_json(rounded.float()),
            "torch_bf16": tensor_json(torch.matmul(oa.bfloat16(), ob.bfloat16()).float()),
        })
    write_json(sys.argv[1], {"torch": torch.__version__, "cases": cases})


if __name__ == "__main__":
    main()
