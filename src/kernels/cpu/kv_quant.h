// Block formats of a quantized KV cache. One cache entry is one head vector of head_dim values
// (a key or a value of one kv head at one position), encoded on its own into kv_row_bytes bytes;
// an entry never shares bytes with another, so a row of the cache can be written, copied or
// read per position. The scalar encode/decode here are the readable contract; the attention
// kernel (kv_attention.h) reads the same bytes without decoding them into a copy.
//
// Formats (all little-endian; fp16 = IEEE binary16, rounded to nearest even):
//   f32   4 bytes a value.            bf16 / f16: 2 bytes a value (NaN stays NaN, inf stays inf).
//   q8_0  blocks of 32: fp16 scale d, then 32 int8 codes;  x = d * code.          34 B / 32 values
//   q4_0  blocks of 32: fp16 scale d, then 16 bytes; byte j holds value j in its low nibble and
//         value j + 16 in its high nibble (llama.cpp's layout); x = d * (nibble - 8). 18 B / 32 values
//   turbo4 / turbo3  blocks of n = 128 values (head_dim a multiple of 128), or one block of
//         n = head_dim values when head_dim < 128 is a power of two >= 8. A block stores one fp16
//         norm s, then n codes of 4 (turbo4) or 3 (turbo3) bits. Encoding: y = R x with the
//         orthogonal rotation R = H·S/sqrt(n) (S: fixed random signs, H: the Sylvester
//         Walsh–Hadamard matrix), so each y_i is roughly N(0, |x|²/n); code_i = the nearest level
//         of the Lloyd-Max codebook of a standard Gaussian to y_i·sqrt(n)/|x|; s = |x| / |c| where
//         c_i = level[code_i], so the reconstruction x̂ = Rᵀ (s·c) has exactly the norm of x (up to
//         the fp16 rounding of s). turbo4: 2 + n/2 bytes (66 B / 128 values), turbo3: 2 + 3n/8
//         (50 B / 128 values, codes packed 8 to 3 bytes, code i at bits 3i.. of the 24-bit group).
// Non-finite input: q8_0, q4_0 and the turbo formats store a NaN scale/norm for a block holding a
// NaN or an infinity, or whose scale would overflow fp16, so the whole block decodes as NaN -- a
// fault stays visible (as it would in an f32 cache) instead of being clipped into plausible values.
#pragma once
#include <cstdint>
#include <cstring>

namespace corelm::kernels {

// The same values and order as model::KVCacheType (the model maps one onto the other).
enum class KVFormat : int { F32, BF16, F16, Q8_0, Q4_0, Turbo4, Turbo3 };

const char* kv_format_name(KVFormat f);

inline constexpr int64_t kQuantBlock = 32;       // q8_0 / q4_0 block length
inline constexpr int64_t kTurboMaxBlock = 128;   // turbo block length for head_dim >= 128
// Seed of the rotation's signs: sign_i = -1 iff the top bit of splitmix64(kTurboSignSeed + i) is
// set (splitmix64 as in Steele, Lea, Flood, "Fast splittable pseudorandom number generators", 2014).
inline constexpr uint64_t kTurboSignSeed = 0x7475'7262'6f6b'7600ull;  // "turbokv\0"

bool kv_format_is_turbo(KVFormat f);
// Values per block for head vectors of head_dim values (1 for f32/bf16/f16). Throws ValueError
// naming the format when head_dim does not fit it (q8_0/q4_0: a multiple of 32; turbo: a
// multiple of 128 or a power of two in [8, 128)).
int64_t kv_block_values(KVFormat f, int64_t head_dim);
int64_t kv_block_bytes(KVFormat f, int64_t n);      // bytes of one block of n values
int64_t kv_row_bytes(KVFormat f, int64_t head_dim);  // bytes of one head vector (validated)

// One head vector of head_dim values <-> kv_row_bytes(f, head_dim) bytes.
void kv_encode_row(KVFormat f, const float* x, int64_t head_dim, uint8_t* out);
void kv_decode_row(KVFormat f, const uint8_t* in, int64_t head_dim, float* x);

// The turbo rotation of one block of n values (a power of two <= 128), in place: y = R x and
// x = Rᵀ y. R is orthogonal, so R·Rᵀ = I and norms are preserved (up to rounding).
void turbo_rotate(float* x, int64_t n);
void turbo_unrotate(float* x, int64_t n);
// The random signs S (n <= 128 uses the first n).
const float* turbo_signs();

// Lloyd-Max levels of a standard Gaussian, ascending: 16 for bits = 4, 8 for bits = 3.
// Computed at first use by Lloyd's iteration (levels = centroids of their cells, cell bounds =
// midpoints of neighbouring levels) on the exact Gaussian density; the fixed point is Max's
// table (J. Max, "Quantizing for minimum distortion", IRE Trans. Inf. Theory, 1960).
const float* turbo_codebook(int bits);
int turbo_bits(KVFormat f);  // 4 for turbo4, 3 for turbo3

// fp16 <-> f32 by bit manipulation, inline for the attention loops (f16_to_float of core is
// the same function out of line; the tests compare them over all 65536 patterns).
inline float kv_half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  uint32_t bits;
  if (em >= 0x7c00u) {
    bits = 0x7f800000u | ((em & 0x3ffu) << 13);  // inf / NaN (payload kept)
  } else if (em >= 0x0400u) {
    bits = (em << 13) + ((127u - 15u) << 23);  // normal: rebias the exponent
  } else {
    // Subnormal: value = em * 2^-24, exact in f32 (no denormal float arithmetic involved).
    const float v = static_cast<float>(em) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &v, 4);
  }
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t kv_float_to_half(float f);  // round to nearest even; NaN stays NaN; overflow -> inf

}  // namespace corelm::kernels
