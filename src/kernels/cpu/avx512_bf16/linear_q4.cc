// AVX-512 VNNI 4-bit linear: vpdpbusd of the u8 codes (one 64-byte group of a panel, masked or
// shifted into 16 lanes x 4 codes) with four broadcast s8 activations, int32 accumulation per
// block; then the per-block fp32 epilogue of reference/linear_q4.h. Exact integer sums and the
// same FMAs per lane: bitwise equal to the reference.
// Tiles: 1-2 rows x 4 panels (64 columns) for decode, 3-4 rows x 2 panels otherwise (16 fp32 and
// 16 int32 accumulators at most of the 32 zmm).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/linear_q4_tiles.h"

namespace corelm::kernels::avx512_bf16 {
namespace {

struct ZmmVnni {
  static constexpr int kLanes = 16;
  using F = __m512;
  using I = __m512i;
  using IAcc = __m512i;
  static __mmask16 first(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  static I load_codes(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I low(I r) { return _mm512_and_si512(r, _mm512_set1_epi8(0x0f)); }
  static I high(I r) { return _mm512_and_si512(_mm512_srli_epi16(r, 4), _mm512_set1_epi8(0x0f)); }
  static IAcc acc_zero() { return _mm512_setzero_si512(); }
  static IAcc dot(IAcc acc, I codes, int32_t x4) { return _mm512_dpbusd_epi32(acc, codes, _mm512_set1_epi32(x4)); }
  static I finish(IAcc acc) { return acc; }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static I sub_i32(I v, int32_t s) { return _mm512_sub_epi32(v, _mm512_set1_epi32(s)); }
  static F load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F zero() { return _mm512_setzero_ps(); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store_n(float* p, F v, int n) { _mm512_mask_storeu_ps(p, first(n), v); }
};

}  // namespace

void linear_q4_block(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  q4_block_vnni_shapes<ZmmVnni>(a, m0, m1, p0, p1);
}

}  // namespace corelm::kernels::avx512_bf16
