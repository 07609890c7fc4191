#include "kernels/cpu/reference/activation.h"

#include <algorithm>
#include <cmath>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {
namespace {

constexpr int64_t kElementGrain = 1 << 14;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Row r of the [outer, n, inner] layout starts at (r / inner) * n * inner + r % inner and
// walks with stride `inner`.
int64_t row_start(int64_t row, int64_t n, int64_t inner) {
  return (row / inner) * n * inner + row % inner;
}

int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)); }

}  // namespace

void silu_forward(const float* x, float* y, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
  });
}

void silu_backward(const float* x, const float* grad_y, float* grad_x, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float s = sigmoid(x[i]);
      grad_x[i] = grad_y[i] * s * (1.0f + x[i] * (1.0f - s));
    }
  });
}

void swiglu_forward(const float* gate, const float* up, float* y, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  });
}

void swiglu_backward(const float* gate, const float* up, const float* grad_y, float* grad_gate,
                     float* grad_up, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float s = sigmoid(gate[i]);
      grad_up[i] = grad_y[i] * gate[i] * s;
      grad_gate[i] = grad_y[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
    }
  });
}

void softmax_forward(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  parallel_for(outer * inner, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + row_start(r, n, inner);
      float* yr = y + row_start(r, n, inner);
      float max_value = -INFINITY;
      for (int64_t j = 0; j < n; ++j) max_value = std::max(max_value, xr[j * inner]);
      double total = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        yr[j * inner] = std::exp(xr[j * inner] - max_value);
        total += yr[j * inner];
      }
      const float inv_total = static_cast<float>(1.0 / total);
      for (int64_t j = 0; j < n; ++j) yr[j * inner] *= inv_total;
    }
  });
}

void softmax_backward(const float* y, const float* grad_y, float* grad_x, int64_t outer,
                      int64_t n, int64_t inner) {
  parallel_for(outer * inner, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = row_start(r, n, inner);
      double dot = 0.0;
      for (int64_t j = 0; j < n; ++j) dot += double(grad_y[s + j * inner]) * y[s + j * inner];
      const float dotf = static_cast<float>(dot);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t i = s + j * inner;
        grad_x[i] = y[i] * (grad_y[i] - dotf);
      }
    }
  });
}

void log_softmax_forward(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  parallel_for(outer * inner, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + row_start(r, n, inner);
      float* yr = y + row_start(r, n, inner);
      float max_value = -INFINITY;
      for (int64_t j = 0; j < n; ++j) max_value = std::max(max_value, xr[j * inner]);
      double total = 0.0;
      for (int64_t j = 0; j < n; ++j) total += std::exp(xr[j * inner] - max_value);
      const float log_total = static_cast<float>(std::log(total));
      for (int64_t j = 0; j < n; ++j) yr[j * inner] = (xr[j * inner] - max_value) - log_total;
    }
  });
}

void log_softmax_backward(const float* y, const float* grad_y, float* grad_x, int64_t outer,
                          int64_t n, int64_t inner) {
  parallel_for(outer * inner, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = row_start(r, n, inner);
      double total = 0.0;
      for (int64_t j = 0; j < n; ++j) total += grad_y[s + j * inner];
      const float totalf = static_cast<float>(total);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t i = s + j * inner;
        grad_x[i] = grad_y[i] - std::exp(y[i]) * totalf;
      }
    }
  });
}

void dropout_apply(const float* x, const uint8_t* keep, float scale, float* y, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = keep[i] ? x[i] * scale : 0.0f;
  });
}

}  // namespace corelm::kernels::reference
