// Dispatch of the row primitives: AVX-512 kernels when the active path has them, else portable
// loops (the AVX2 path; the reference path never calls these).
#include "kernels/cpu/vec_fast.h"

#include <algorithm>
#include <cmath>

#include "corelm/isa.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/reference/activation.h"

namespace corelm::kernels::fast {
namespace {

bool use_avx512() { return static_cast<int>(active_isa()) >= static_cast<int>(Isa::Avx512); }

constexpr int64_t kElementGrain = 1 << 14;

}  // namespace

float row_max(const float* x, int64_t n) {
  if (use_avx512()) return avx512::train_row_max(x, n);
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

double exp_shift_sum(const float* x, float* y, int64_t n, float shift) {
  if (use_avx512()) return avx512::train_exp_shift_sum(x, y, n, shift);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    total += y[i];
  }
  return total;
}

void exp_shift_scale(const float* x, float* y, int64_t n, float shift, float scale) {
  if (use_avx512()) return avx512::train_exp_shift_scale(x, y, n, shift, scale);
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift) * scale;
}

void scale_inplace(float* x, int64_t n, float scale) {
  if (use_avx512()) return avx512::train_scale_inplace(x, n, scale);
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

double dot(const float* a, const float* b, int64_t n) {
  if (use_avx512()) return avx512::train_dot(a, b, n);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += double(a[i] * b[i]);
  return total;
}

void softmax_backward_row(const float* p, const float* dp, float* ds, int64_t n, float centre, float scale) {
  if (use_avx512()) return avx512::train_softmax_backward_row(p, dp, ds, n, centre, scale);
  for (int64_t i = 0; i < n; ++i) ds[i] = p[i] * (dp[i] - centre) * scale;
}

void swiglu_forward(const float* gate, const float* up, float* y, int64_t n) {
  if (!use_avx512()) return reference::swiglu_forward(gate, up, y, n);
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    avx512::train_swiglu_forward(gate + begin, up + begin, y + begin, end - begin);
  });
}

void swiglu_backward(const float* gate, const float* up, const float* grad_y, float* grad_gate, float* grad_up,
                     int64_t n) {
  if (!use_avx512()) return reference::swiglu_backward(gate, up, grad_y, grad_gate, grad_up, n);
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    avx512::train_swiglu_backward(gate + begin, up + begin, grad_y + begin, grad_gate + begin, grad_up + begin,
                                  end - begin);
  });
}

void adamw_update_portable(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  for (int64_t j = 0; j < n; ++j) {
    w[j] *= s.decay;
    m[j] = m[j] * s.beta1 + s.one_minus_b1 * g[j];
    v[j] = v[j] * s.beta2 + s.one_minus_b2 * g[j] * g[j];
    const float denom = std::sqrt(v[j]) / s.bc2_sqrt + s.eps;
    w[j] -= s.step_size * (m[j] / denom);
  }
}

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  parallel_for(n, kElementGrain * 4, [&](int64_t begin, int64_t end) {
    if (use_avx512())
      avx512::train_adamw_update(w + begin, g + begin, m + begin, v + begin, end - begin, s);
    else
      adamw_update_portable(w + begin, g + begin, m + begin, v + begin, end - begin, s);
  });
}

}  // namespace corelm::kernels::fast
