#include "kernels/cpu/reference/linear_int8.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {

float quantize_row_int8(const float* x, int64_t k, int8_t* q) {
  float a = 0.0f;
  bool finite = true;
  for (int64_t t = 0; t < k; ++t) {
    finite &= std::isfinite(x[t]);
    a = std::max(a, std::fabs(x[t]));
  }
  if (a == 0.0f || !finite) {
    for (int64_t t = 0; t < k; ++t) q[t] = 0;
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / a;
  for (int64_t t = 0; t < k; ++t) {
    const float r = std::nearbyint(x[t] * inv);
    q[t] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  return a / 127.0f;
}

void linear_int8(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y, int64_t ldy) {
  const int64_t n = W.n, k = W.k;
  parallel_for(m, 1, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> q(static_cast<size_t>(k));
    for (int64_t i = begin; i < end; ++i) {
      const float x_scale = quantize_row_int8(X + i * ldx, k, q.data());
      for (int64_t j = 0; j < n; ++j) {
        const int8_t* w = W.data.data() + j * k;
        int32_t dot = 0;
        for (int64_t t = 0; t < k; ++t) dot += int32_t{q[t]} * int32_t{w[t]};
        Y[i * ldy + j] = dequantize_int8(dot, x_scale, W.scale[j], W.bias.empty() ? 0.0f : W.bias[j]);
      }
    }
  });
}

}  // namespace corelm::kernels::reference
