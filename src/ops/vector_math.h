// Vectorised whole-buffer loops the training loop needs outside any op (the gradient norm, the
// AdamW update), passed up from kernels/cpu/vec_fast.h so that nothing above ops includes
// kernels/. Same contracts: fixed reduction order, results independent of the thread count, and
// the AdamW update bitwise equal on every path. Private to the library (train and ops).
#pragma once
#include <cstdint>

namespace corelm::ops {

// sum of a[i] * b[i], accumulated in double in a fixed order.
double dot_f64(const float* a, const float* b, int64_t n);

// One AdamW step over n parameters, in this order (each a separately rounded IEEE operation):
//   w *= decay;  m = m * beta1 + one_minus_b1 * g;  v = v * beta2 + (one_minus_b2 * g) * g;
//   w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps))
struct AdamWScalars {
  float decay = 1, beta1 = 0, one_minus_b1 = 1, beta2 = 0, one_minus_b2 = 1, bc2_sqrt = 1, eps = 0, step_size = 0;
};
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

}  // namespace corelm::ops
