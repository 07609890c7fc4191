// AVX2 4-bit linear (also the path of AVX-512 CPUs without VNNI): vpmaddubsw multiplies the u8
// codes (<= 15) by the s8 activations (|q| <= 127) and adds pairs into s16 lanes, at most 3,810
// each. A block is 8 such instructions per lane, so the s16 lanes sum 16 products, at most
// 16 * 15 * 127 = 30,480 < 32,767: they accumulate in s16 exactly (no saturation), and one
// vpmaddwd by ones per block widens them to the int32 dot. Exact, hence bitwise equal to the
// reference. A 64-byte group of a panel is two ymm of 8 columns.
// Tiles: 1 row x 2 panels (32 columns) for decode, 2 rows x 1 panel otherwise (16 ymm registers).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/linear_q4_tiles.h"

namespace corelm::kernels::avx2 {
namespace {

struct Ymm {
  static constexpr int kLanes = 8;
  using F = __m256;
  using I = __m256i;
  using IAcc = __m256i;  // s16 pair sums
  static I load_codes(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I low(I r) { return _mm256_and_si256(r, _mm256_set1_epi8(0x0f)); }
  static I high(I r) { return _mm256_and_si256(_mm256_srli_epi16(r, 4), _mm256_set1_epi8(0x0f)); }
  static IAcc acc_zero() { return _mm256_setzero_si256(); }
  static IAcc dot(IAcc acc, I codes, int32_t x4) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(codes, _mm256_set1_epi32(x4)));
  }
  static I finish(IAcc acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static I sub_i32(I v, int32_t s) { return _mm256_sub_epi32(v, _mm256_set1_epi32(s)); }
  static F load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F zero() { return _mm256_setzero_ps(); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F load_n(const float* p, int n) {
    if (n == kLanes) return _mm256_loadu_ps(p);
    alignas(32) float t[kLanes] = {};
    for (int c = 0; c < n; ++c) t[c] = p[c];
    return _mm256_load_ps(t);
  }
  static void store_n(float* p, F v, int n) {
    if (n == kLanes) return _mm256_storeu_ps(p, v);
    alignas(32) float t[kLanes];
    _mm256_store_ps(t, v);
    for (int c = 0; c < n; ++c) p[c] = t[c];
  }
};

}  // namespace

void linear_q4_block(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  if (a.min)
    q4_block<Ymm, 2, 1, 1, 2, true>(a, m0, m1, p0, p1);
  else
    q4_block<Ymm, 2, 1, 1, 2, false>(a, m0, m1, p0, p1);
}

}  // namespace corelm::kernels::avx2
