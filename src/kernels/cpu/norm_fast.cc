#include "kernels/cpu/norm_fast.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "corelm/thread_pool.h"
#include "kernels/cpu/vec_fast.h"

namespace corelm::kernels::fast {
namespace {

int64_t row_grain(int64_t d) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)); }

}  // namespace

void rms_norm_forward(const float* x, const float* weight, float* y, float* inv_rms, int64_t rows, int64_t d,
                      float eps) {
  parallel_for(rows, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      const float mean_square = d > 0 ? static_cast<float>(dot(xr, xr, d) / double(d)) : 0.0f;
      const float scale = 1.0f / std::sqrt(mean_square + eps);
      if (inv_rms) inv_rms[r] = scale;
      for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] * scale) * weight[j];
    }
  });
}

void rms_norm_backward(const float* x, const float* weight, const float* inv_rms, const float* grad_y,
                       float* grad_x, float* grad_weight, int64_t rows, int64_t d) {
  parallel_for(rows, row_grain(d), [&](int64_t begin, int64_t end) {
    std::vector<float> gw(static_cast<size_t>(d));
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      const float* gr = grad_y + r * d;
      const float scale = inv_rms[r];
      for (int64_t j = 0; j < d; ++j) gw[j] = gr[j] * weight[j];
      // sum_j (g_j w_j) * xhat_j with xhat = x * scale
      const float mean_dot = d > 0 ? static_cast<float>(dot(gw.data(), xr, d) * scale / double(d)) : 0.0f;
      float* gxr = grad_x + r * d;
      for (int64_t j = 0; j < d; ++j) gxr[j] = scale * (gw[j] - (xr[j] * scale) * mean_dot);
    }
  });
  // Per column in row order (rows outer within a chunk of columns, reading x and grad_y along rows).
  parallel_for(d, 64, [&](int64_t begin, int64_t end) {
    std::vector<double> totals(static_cast<size_t>(end - begin), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * d;
      const float* gr = grad_y + r * d;
      for (int64_t j = begin; j < end; ++j) totals[j - begin] += double(gr[j]) * (xr[j] * inv_rms[r]);
    }
    for (int64_t j = begin; j < end; ++j) grad_weight[j] = static_cast<float>(totals[j - begin]);
  });
}

}  // namespace corelm::kernels::fast
