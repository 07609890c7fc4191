#include "kernels/cpu/reference/gemm.h"

#include <algorithm>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  if (M == 0 || N == 0) return;
  const int64_t work_per_row = N * (K > 0 ? K : 1);
  const int64_t grain = work_per_row >= 32768 ? 1 : 32768 / work_per_row;
  parallel_for(M, grain, [&](int64_t begin, int64_t end) {
    // Row i of op(A), gathered once so both loop orders below read it contiguously.
    std::vector<float> a_row(static_cast<size_t>(K));
    std::vector<float> acc(static_cast<size_t>(trans_b ? 0 : N));
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t k = 0; k < K; ++k) a_row[k] = trans_a ? A[k * lda + i] : A[i * lda + k];
      float* c = C + i * ldc;
      if (!trans_b) {
        // i-k-j: the inner loop streams a row of B and a row of C.
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t k = 0; k < K; ++k) {
          const float aik = a_row[k];
          const float* b = B + k * ldb;
          for (int64_t j = 0; j < N; ++j) acc[j] += aik * b[j];
        }
        for (int64_t j = 0; j < N; ++j) c[j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * c[j]);
      } else {
        // B^T: row j of B is column j of op(B), so each C element is a contiguous dot product.
        for (int64_t j = 0; j < N; ++j) {
          const float* b = B + j * ldb;
          // Eight independent partial sums (combined in a fixed order) let the compiler
          // vectorise the dot product without changing results between runs.
          float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t k = 0;
          for (; k + 8 <= K; k += 8)
            for (int l = 0; l < 8; ++l) lanes[l] += a_row[k + l] * b[k + l];
          float acc = 0.0f;
          for (; k < K; ++k) acc += a_row[k] * b[k];
          for (int l = 0; l < 8; ++l) acc += lanes[l];
          c[j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * c[j]);
        }
      }
    }
  });
}

}  // namespace corelm::kernels::reference
