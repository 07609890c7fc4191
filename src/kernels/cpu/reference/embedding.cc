#include "kernels/cpu/reference/embedding.h"

#include <cstring>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {

void embedding_forward(const float* weight, int64_t D, const int64_t* ids, int64_t n, float* out) {
  if (n == 0 || D == 0) return;
  const int64_t grain = D >= 4096 ? 1 : 4096 / D;
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(out + i * D, weight + ids[i] * D, static_cast<size_t>(D) * sizeof(float));
  });
}

void embedding_backward(const float* grad_out, int64_t D, const int64_t* ids, int64_t n,
                        float* grad_weight) {
  if (n == 0 || D == 0) return;
  // Threads split the columns, never the ids: every element still sums its ids in order.
  parallel_for(D, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = 0; i < n; ++i) {
      float* dst = grad_weight + ids[i] * D;
      const float* src = grad_out + i * D;
      for (int64_t d = begin; d < end; ++d) dst[d] += src[d];
    }
  });
}

}  // namespace corelm::kernels::reference
