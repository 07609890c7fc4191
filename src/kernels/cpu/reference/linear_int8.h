// Scalar reference of the int8 linear (kernels/cpu/linear_int8.h): the arithmetic every int8 path
// reproduces bit for bit.
//
//   activation row x (k values):  a = max_t |x_t|
//     a == 0          -> q = 0,  scale = 0
//     a not finite    -> q = 0,  scale = NaN  (the row's outputs become NaN)
//     else            -> q_t = clamp(nearbyint(x_t * (127 / a)), -127, 127),  scale = a / 127
//   weight row w_j: the same with s_w[j] = max|w_j| / 127, q_w = clamp(nearbyint(w / s_w))
//   dot_ij = sum_t q_x[i,t] * q_w[j,t]          (exact in int32)
//   Y[i,j] = fma(float(dot_ij), scale_i * s_w[j], bias_j)   (bias 0 when absent)
//
// nearbyint rounds to nearest-even in the default rounding mode, as vcvtps2dq does. VNNI computes
// the same dot as sum (q_x + 128) * q_w - 128 * row_sum_j (vpdpbusd needs an unsigned operand).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/linear_int8.h"

namespace corelm::kernels::reference {

// Quantizes k values of x into q[0, k) and returns the scale (rule above).
float quantize_row_int8(const float* x, int64_t k, int8_t* q);

inline float dequantize_int8(int32_t dot, float x_scale, float w_scale, float bias) {
  return std::fma(static_cast<float>(dot), x_scale * w_scale, bias);
}

// Y = the rule above for a weight packed for Isa::Reference (row-major [n, k] int8).
void linear_int8(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y, int64_t ldy);

}  // namespace corelm::kernels::reference
