#include "kernels/cpu/reference/gemm_bf16.h"

#include <vector>

#include "corelm/dtype.h"
#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {
namespace {
float rounded(float x) { return bf16_to_float(float_to_bf16(x)); }
}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  // op(B) rounded once, column-major (column j contiguous over k), so every dot product below
  // reads both operands contiguously.
  std::vector<float> b(static_cast<size_t>(N * K));
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) b[j * K + k] = rounded(trans_b ? B[j * ldb + k] : B[k * ldb + j]);
  parallel_for(M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> a(static_cast<size_t>(K));
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t k = 0; k < K; ++k) a[k] = rounded(trans_a ? A[k * lda + i] : A[i * lda + k]);
      for (int64_t j = 0; j < N; ++j) {
        const float* bj = b.data() + j * K;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += a[k] * bj[k];
        C[i * ldc + j] = accumulate ? C[i * ldc + j] + acc : acc;
      }
    }
  });
}

}  // namespace corelm::kernels::reference
