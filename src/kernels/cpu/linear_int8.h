// Int8 packed linear for inference: weights quantized once at load (symmetric, one scale per output
// row), activations quantized per row on the fly (symmetric, one scale per row), int32 dot products,
// fp32 dequantization. The exact arithmetic is the contract in reference/linear_int8.h; every path
// (scalar reference, AVX-512 VNNI vpdpbusd) produces bitwise identical outputs, because the integer
// sums are exact and the fp32 epilogue is one fused multiply-add in both.
//
// Batch invariance: a row's quantization scale depends only on that row, and integer accumulation
// does not depend on order, so row i of Y depends only on row i of X and W -- never on m, the row's
// position, the other rows or the thread count.
#pragma once
#include <cstdint>
#include <vector>

#include "corelm/isa.h"

namespace corelm::kernels {

struct PackedLinearI8 {
  int64_t n = 0, k = 0;        // out_features, in_features
  int64_t k_padded = 0;        // k rounded up as the layout needs (zero weights in the padding)
  Isa isa = Isa::Reference;    // the kernel it was packed for: Reference, Avx2, Avx512Bf16 (VNNI) or Amx
  std::vector<int8_t> data;    // quantized weights in the kernel's private layout
  std::vector<float> scale;    // per output row: max|w| / 127 (0 for an all-zero row)
  std::vector<int32_t> row_sum;  // per output row: sum of its int8 weights (u8 offset compensation)
  std::vector<float> bias;     // empty: no bias
  size_t bytes() const {
    return data.size() + (scale.size() + bias.size()) * sizeof(float) + row_sum.size() * sizeof(int32_t);
  }
};

// Quantizes W (row-major [n, k], row stride ldw) per output row and packs it for the int8 kernel
// of active_isa(): AMX tiles on Amx, VNNI on Avx512Bf16, vpmaddubsw on Avx2/Avx512, else the
// reference. `bias` may be null.
// ValueError for n < 1, k < 1, k > kMaxLinearInt8K, ldw < k, a null W or a non-finite weight.
PackedLinearI8 pack_linear_int8(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias);
// The same for an explicit kernel (Reference, Avx2, Avx512Bf16 or Amx); ValueError if this CPU
// lacks it or it is not an int8 kernel (Avx512).
PackedLinearI8 pack_linear_int8(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Isa kernel);

// u8 x s8 products of a row sum to at most k * 255 * 127, which must fit an int32.
inline constexpr int64_t kMaxLinearInt8K = 65536;

// Y[m, n] = dequant(quant(X[m, :]) . Wq[n, :]) (+ bias[n]) with the kernel W was packed for.
// X, Y fp32 with row strides ldx >= k, ldy >= n. A row of X holding inf or NaN yields a NaN row.
// Uses the thread pool (blocks over output columns); results do not depend on the thread count.
void linear_int8(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y, int64_t ldy);

// Measured single-thread vpdpbusd peak in GOP/s (a multiply-add counts as 2 ops); 0 unless
// active_isa() >= Avx512Bf16.
double int8_dot_peak_gops(double seconds);

}  // namespace corelm::kernels

// ---- Internal to the kernels component (dispatch <-> ISA translation units) ----
namespace corelm::kernels {

// VNNI layout: panels of kInt8Panel output columns; within a panel, groups of 4 consecutive k are
// outermost and each column holds its 4 weights of a group in one 32-bit lane:
// data[panel * kp * kInt8Panel + (t / 4) * 4 * kInt8Panel + (j % kInt8Panel) * 4 + t % 4].
inline constexpr int64_t kInt8Panel = 64;

// One call's operands after the activations were quantized: xq holds row i's k_padded values at
// xq + i * kp (u8 = q + 128 for VNNI), xscale[i] its scale. Plain pointers only: the ISA
// translation units use no std containers (no ISA-compiled copies of shared inline code).
struct LinearI8Args {
  const uint8_t* xq = nullptr;
  const float* xscale = nullptr;
  int64_t kp = 0;
  const int8_t* W = nullptr;         // PackedLinearI8::data
  const float* wscale = nullptr;     // PackedLinearI8::scale
  const int32_t* row_sum = nullptr;  // PackedLinearI8::row_sum
  const float* bias = nullptr;       // null: no bias
  int64_t n = 0;
  float* Y = nullptr;
  int64_t ldy = 0;
};

namespace avx512_bf16 {
// Quantizes rows [0, m) of X into u8 (q + 128, padding = 128) exactly as reference::quantize_row.
void quantize_rows_u8(const float* X, int64_t m, int64_t ldx, int64_t k, int64_t kp, uint8_t* xq, float* xscale);
// Y rows [m0, m1) x panels [p0, p1).
void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
float dpbusd_peak_loop(int64_t iters);
}  // namespace avx512_bf16

namespace avx2 {
// vpmaddubsw / vpmaddwd on the VNNI layout (avx2/linear_int8.cc); a.xq as for VNNI (u8 = q + 128).
void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
}  // namespace avx2

// AMX tdpbusd (amx_tile_kernels.h): the VNNI panel layout with kp padded to a multiple of
// kAmxKInt8; a.xq must hold the call's rows padded to a multiple of 16 rows (any bytes there).
inline constexpr int64_t kAmxKInt8 = 64;
namespace amx {
void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
}  // namespace amx
namespace amx_emulated {
void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
}  // namespace amx_emulated

}  // namespace corelm::kernels
