#include "kernels/cpu/reference/rope.h"

#include <cmath>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {

void rope_apply(const float* x, float* y, int64_t rows, int64_t seq, int64_t d, float theta,
                int64_t position_offset, bool inverse) {
  const int64_t half = d / 2;
  // HF: inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all f32.
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
    inv_freq[i] = 1.0f / std::pow(theta, exponent);
  }
  std::vector<float> cos_table(seq * half), sin_table(seq * half);
  for (int64_t t = 0; t < seq; ++t) {
    const float position = static_cast<float>(position_offset + t);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * inv_freq[i];
      cos_table[t * half + i] = std::cos(angle);
      sin_table[t * half + i] = inverse ? -std::sin(angle) : std::sin(angle);
    }
  }
  parallel_for(rows * seq, 16, [&](int64_t begin, int64_t end) {
    for (int64_t rt = begin; rt < end; ++rt) {
      const int64_t t = rt % seq;
      const float* c = cos_table.data() + t * half;
      const float* s = sin_table.data() + t * half;
      const float* xr = x + rt * d;
      float* yr = y + rt * d;
      for (int64_t i = 0; i < half; ++i) {
        const float lo = xr[i], hi = xr[i + half];
        yr[i] = lo * c[i] - hi * s[i];
        yr[i + half] = hi * c[i] + lo * s[i];
      }
    }
  });
}

}  // namespace corelm::kernels::reference
