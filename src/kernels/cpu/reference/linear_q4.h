// Scalar reference of the 4-bit linear (kernels/cpu/linear_q4.h): the arithmetic every q4 path
// reproduces bit for bit. Blocks are 32 consecutive inputs of one row (the last block of a row
// whose k is not a multiple of 32 is short; the packing pads it with zeros).
//
//   weight block w (once, at packing), fp16 scale d (and m) rounded first, codes from the rounded values:
//     Symmetric: v = the value of largest |v| (first on ties); d = fp16(v / -8)
//                code_t = clamp(nearbyint(w_t / d), -8, 7) + 8      (all 8 when d == 0)
//     WithMin:   d = fp16((max - min) / 15), m = fp16(min)
//                code_t = clamp(nearbyint((w_t - m) / d), 0, 15)     (all 0 when d == 0)
//   activation block x (per row and call): a = max |x_t|
//     a == 0 -> q = 0, s = 0;  a not finite -> q = 0, s = NaN (the row's outputs become NaN)
//     else q_t = clamp(nearbyint(x_t * (127 / a)), -127, 127), s = a / 127;  sum = sum_t q_t
//   per output (i, j), acc = 0, then for each block b in order (dot = sum_t code_t * q_t, exact int32):
//     Symmetric: acc = fma(float(dot - 8 * sum), s * d, acc)
//     WithMin:   acc = fma(float(dot), s * d, acc);  acc = fma(float(sum), s * m, acc)
//   Y[i, j] = acc + bias_j   (bias 0 when absent)
//
// The u8 codes are the unsigned operand vpdpbusd / vpmaddubsw need; "- 8 * sum" turns them back
// into the signed symmetric codes without a per-weight subtraction.
#pragma once
#include <cstdint>

#include "kernels/cpu/linear_q4.h"

namespace corelm::kernels::reference {

// Quantizes `len` (1..32) weights of one block (rule above): codes[0, len) in [0, 15]; the fp16
// bits of d (and m, WithMin) in scale / min. Returns false if a value is not finite or d, m overflow fp16.
bool quantize_weight_block_q4(const float* w, int64_t len, Q4Format format, uint8_t* codes, uint16_t& scale,
                              uint16_t& min);

// Quantizes `len` (1..32) activations of one block into q[0, len); returns s, sets sum.
float quantize_activation_block_q8(const float* x, int64_t len, int8_t* q, int32_t& sum);

// Rows [0, m) of X into the padded per-block form of LinearQ4Args (xq: kp values a row, zeros past k;
// xscale and xsum: nb = kp / 32 a row).
void quantize_activation_rows_q8(const float* X, int64_t m, int64_t ldx, int64_t k, int64_t kp, int8_t* xq,
                                 float* xscale, int32_t* xsum);

float fp16_value(uint16_t bits);

// Y = the rule above, reading the shared packed layout one code at a time.
void linear_q4(const float* X, int64_t m, int64_t ldx, const PackedLinearQ4& W, float* Y, int64_t ldy);

}  // namespace corelm::kernels::reference
