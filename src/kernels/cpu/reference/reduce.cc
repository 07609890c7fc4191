#include "kernels/cpu/reference/reduce.h"

#include <algorithm>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {

void sum_middle(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* out) {
  if (outer == 0 || inner == 0) return;
  const int64_t work_per_outer = reduce * inner > 0 ? reduce * inner : 1;
  const int64_t grain = work_per_outer >= 8192 ? 1 : 8192 / work_per_outer;
  parallel_for(outer, grain, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(inner));
    for (int64_t o = begin; o < end; ++o) {
      std::fill(acc.begin(), acc.end(), 0.0);
      const float* block = x + o * reduce * inner;
      for (int64_t r = 0; r < reduce; ++r) {
        const float* row = block + r * inner;
        for (int64_t i = 0; i < inner; ++i) acc[i] += row[i];
      }
      for (int64_t i = 0; i < inner; ++i) out[o * inner + i] = static_cast<float>(acc[i]);
    }
  });
}

}  // namespace corelm::kernels::reference
