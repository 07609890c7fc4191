// Packed 4-bit linear for bandwidth-bound inference (Precision::Q4): weights quantized once at load
// in blocks of kQ4Block consecutive inputs of one output row (4-bit codes + an fp16 scale, and an
// fp16 minimum in the WithMin format), activations quantized to int8 per block of the same 32 on the
// fly, integer dot products per block, one fp32 FMA per block. The exact arithmetic is the contract
// in reference/linear_q4.h; every path (scalar reference, AVX2 vpmaddubsw, AVX-512 VNNI vpdpbusd)
// produces bitwise identical outputs: the per-block integer sums are exact and every path runs the
// same fp32 operations per block in the same order.
//
// K that is not a multiple of kQ4Block is padded with zero activations (and weights that contribute
// nothing), so the result is that of the unpadded product; no shape is refused for it.
//
// Batch invariance: an activation block's scale depends only on that block of that row, and each
// output sums its blocks in order from zero, so row i of Y depends only on row i of X and W.
#pragma once
#include <cstdint>
#include <vector>

#include "corelm/isa.h"

namespace corelm::kernels {

inline constexpr int64_t kQ4Block = 32;  // inputs per weight/activation block
inline constexpr int64_t kQ4Panel = 16;  // output columns per panel (one zmm of int32 lanes)

// Symmetric (Q4_0-like): w = d * (code - 8), code in [0, 15]; the block's value of largest
// magnitude maps to code 0 exactly. WithMin (Q4_1-like): w = d * code + m, m = the block minimum.
enum class Q4Format { Symmetric, WithMin };
const char* q4_format_name(Q4Format f);  // "sym" | "min"

struct PackedLinearQ4 {
  int64_t n = 0, k = 0;           // out_features, in_features
  int64_t k_padded = 0;           // k rounded up to kQ4Block
  Isa isa = Isa::Reference;       // the kernel that runs it: Reference, Avx2 or Avx512Bf16 (VNNI)
  Q4Format format = Q4Format::Symmetric;
  // Codes in the panel layout below (the same for every kernel): n_panels * k_padded / 2 bytes.
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scale;    // fp16 bits, [panel][block][16 columns] (0 for padding columns)
  std::vector<uint16_t> min;      // fp16 bits, as scale; WithMin only (empty for Symmetric)
  std::vector<float> bias;        // empty: no bias
  size_t bytes() const { return codes.size() + (scale.size() + min.size()) * 2 + bias.size() * sizeof(float); }
};

// Quantizes W (row-major [n, k], row stride ldw) in blocks of 32 and packs it for the q4 kernel of
// active_isa() (VNNI on Avx512Bf16/Amx, vpmaddubsw on Avx2/Avx512, else the reference). `bias`
// may be null. ValueError for n < 1, k < 1, ldw < k, a null W or a non-finite weight (naming its row).
PackedLinearQ4 pack_linear_q4(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias,
                              Q4Format format = Q4Format::WithMin);
// The same for an explicit kernel (Reference, Avx2 or Avx512Bf16); ValueError if this CPU lacks it
// or it has no q4 kernel of its own (Avx512, Amx).
PackedLinearQ4 pack_linear_q4(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Q4Format format,
                              Isa kernel);

// The format the inference path packs: WithMin unless $CORELM_Q4_FORMAT=sym (read once; any other
// value is a ValueError naming the accepted ones). WithMin measured better on stories260K
// (docs/KERNELS.md): +7.7% perplexity vs f32 against Symmetric's +9.2%, for 5.0 instead of 4.5 bits
// a weight.
Q4Format preferred_q4_format();

// Y[m, n] = sum over blocks of dequant(quant(X block) . W block) (+ bias[n]) with the kernel W was
// packed for. X, Y fp32 with row strides ldx >= k, ldy >= n. A row of X holding inf or NaN yields
// a NaN row. Uses the thread pool (blocks over output columns); results do not depend on it.
void linear_q4(const float* X, int64_t m, int64_t ldx, const PackedLinearQ4& W, float* Y, int64_t ldy);

}  // namespace corelm::kernels

// ---- Internal to the kernels component (dispatch <-> ISA translation units) ----
namespace corelm::kernels {

// Code layout. Panel p holds columns [16p, 16p + 16); within a panel, block b (inputs
// [32b, 32b + 32)) is 256 contiguous bytes: 4 groups g of 8 inputs, each 64 bytes = 16 columns x 4
// bytes. Byte e (0-3) of column c in group g holds the code of input 32b + 8g + e in its low nibble
// and of input 32b + 8g + e + 4 in its high nibble. So one 64-byte load, masked with 0x0f or
// shifted right by 4, is 16 int32 lanes of 4 u8 codes each: exactly the operand of vpdpbusd
// (vpmaddubsw on AVX2, two 32-byte halves), and a batch-1 decode reads the codes once, in order.
inline int64_t q4_code_index(int64_t kp, int64_t j, int64_t t) {
  const int64_t panel = j / kQ4Panel, c = j % kQ4Panel, b = t / kQ4Block, g = (t % kQ4Block) / 8, e = t % 8;
  return (panel * (kp / kQ4Block) + b) * (kQ4Block * kQ4Panel / 2) + g * 64 + c * 4 + e % 4;
}
inline int q4_code_shift(int64_t t) { return (t % 8) >= 4 ? 4 : 0; }
inline int64_t q4_scale_index(int64_t kp, int64_t j, int64_t b) {
  return ((j / kQ4Panel) * (kp / kQ4Block) + b) * kQ4Panel + j % kQ4Panel;
}

// One call's operands after the activations were quantized: row i's k_padded int8 values at
// xq + i * kp, its block scales at xscale + i * nb and block sums of the int8 values at xsum + i * nb.
// Plain pointers only: the ISA translation units use no std containers.
struct LinearQ4Args {
  const int8_t* xq = nullptr;
  const float* xscale = nullptr;
  const int32_t* xsum = nullptr;
  int64_t kp = 0, nb = 0;
  const uint8_t* codes = nullptr;
  const uint16_t* scale = nullptr;
  const uint16_t* min = nullptr;  // null: Symmetric
  const float* bias = nullptr;    // null: no bias
  int64_t n = 0;
  float* Y = nullptr;
  int64_t ldy = 0;
};

// Y rows [m0, m1) x panels [p0, p1).
namespace avx512_bf16 {
void linear_q4_block(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
}
namespace avx2 {
void linear_q4_block(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
}
// The VNNI kernel's loops and tile shapes on 16-lane vectors written out in C++ (vpdpbusd as the
// Intel SDM's Operation section describes it), so machines without AVX-512 test that code too.
namespace vnni_emulated {
void linear_q4_block(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
}
// linear_q4 through vnni_emulated (any packing: the layout is shared); tests only.
void linear_q4_vnni_emulation(const float* X, int64_t m, int64_t ldx, const PackedLinearQ4& W, float* Y,
                              int64_t ldy);

}  // namespace corelm::kernels
