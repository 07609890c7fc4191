#include "kernels/cpu/reference/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {
namespace {

float row_inv_rms(const float* x, int64_t d, float eps) {
  double sum_squares = 0.0;
  for (int64_t j = 0; j < d; ++j) sum_squares += double(x[j]) * x[j];
  const float mean_square = d > 0 ? static_cast<float>(sum_squares / double(d)) : 0.0f;
  return 1.0f / std::sqrt(mean_square + eps);
}

int64_t row_grain(int64_t d) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)); }

}  // namespace

void rms_norm_forward(const float* x, const float* weight, float* y, float* inv_rms, int64_t rows,
                      int64_t d, float eps) {
  parallel_for(rows, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      const float scale = row_inv_rms(xr, d, eps);
      if (inv_rms) inv_rms[r] = scale;
      for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] * scale) * weight[j];
    }
  });
}

void rms_norm_backward(const float* x, const float* weight, const float* inv_rms,
                       const float* grad_y, float* grad_x, float* grad_weight, int64_t rows,
                       int64_t d) {
  parallel_for(rows, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      const float* gr = grad_y + r * d;
      const float scale = inv_rms[r];
      double dot = 0.0;  // sum_j (g_j w_j) * xhat_j
      for (int64_t j = 0; j < d; ++j) dot += double(gr[j] * weight[j]) * double(xr[j] * scale);
      const float mean_dot = d > 0 ? static_cast<float>(dot / double(d)) : 0.0f;
      float* gxr = grad_x + r * d;
      for (int64_t j = 0; j < d; ++j) {
        gxr[j] = scale * (gr[j] * weight[j] - (xr[j] * scale) * mean_dot);
      }
    }
  });
  // Column-parallel so each grad_weight entry is summed by one thread in row order. Rows are the
  // outer loop within a chunk of columns, so x and grad_y are read along their rows (a column
  // walk touches a new cache line per element); each entry's sum order is unchanged.
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

}  // namespace corelm::kernels::reference
