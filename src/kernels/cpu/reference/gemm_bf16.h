// Reference bf16 GEMM, row-major, the contract of kernels::gemm_bf16 (gemm.h):
//   C[M, N] = op(bf16(A))[M, K] * op(bf16(B))[K, N]      (accumulate: C += that product)
// with op() as in reference/gemm.h. Every operand value is rounded to bf16 (nearest-even, NaN kept
// NaN: corelm::float_to_bf16) before it is multiplied; a product of two bf16 values is exact in
// fp32, so each element is one fp32 sum over k = 0..K-1 in order, started from zero.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

}  // namespace corelm::kernels::reference
