// Reference single-precision GEMM, row-major:
//   C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C
// op(A) = A (stored M x K, row stride lda) or A^T when trans_a (A stored K x M);
// op(B) = B (stored K x N, row stride ldb) or B^T when trans_b (B stored N x K).
// beta == 0 overwrites C (NaNs already in C do not leak through). Work is split over rows of C,
// each row computed the same way whatever the thread count.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

}  // namespace corelm::kernels::reference
