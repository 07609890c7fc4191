// The training loop's vector loops (ops/vector_math.h) on the kernels of kernels/cpu/vec_fast.h.
#include "ops/vector_math.h"

#include "kernels/cpu/vec_fast.h"

namespace corelm::ops {

double dot_f64(const float* a, const float* b, int64_t n) { return kernels::fast::dot(a, b, n); }

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  kernels::fast::AdamWScalars k;
  k.decay = s.decay;
  k.beta1 = s.beta1;
  k.one_minus_b1 = s.one_minus_b1;
  k.beta2 = s.beta2;
  k.one_minus_b2 = s.one_minus_b2;
  k.bc2_sqrt = s.bc2_sqrt;
  k.eps = s.eps;
  k.step_size = s.step_size;
  kernels::fast::adamw_update(w, g, m, v, n, k);
}

}  // namespace corelm::ops
