// vdpbf16ps vector traits for gemm_bf16_tiles.h (zmm: 16 fp32 lanes, 16 bf16 pairs), shared by
// the AVX-512 BF16 GEMM (avx512_bf16/gemm_bf16.cc) and, for packing, the AMX tile GEMM
// (amx/gemm_tiles.cc; every AMX CPU has AVX-512 BF16). Internal linkage: included only by
// translation units compiled with -mavx512bf16.
#pragma once
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace corelm::kernels::avx512_bf16 {
namespace {

struct Dp16 {
  static constexpr int kWidth = 16;
  using Reg = __m512;
  using Pairs = __m512bh;
  static __mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, Reg v, int n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Pairs load_pairs(const uint32_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static Pairs broadcast_pair(const uint32_t* p) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(*p)); }
  static Reg dot(Reg acc, Pairs a, Pairs b) { return _mm512_dpbf16_ps(acc, a, b); }

  // bf16 bit patterns of 16 floats in the low halves of the dword lanes: nearest-even, NaN kept a
  // quiet NaN (the rule of corelm::float_to_bf16).
  static __m512i bits(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  }
  static void round_row(const float* x, int64_t n, uint16_t* out) {
    for (int64_t t = 0; t < n; t += 16) {
      const __mmask16 m = first(n - t);
      _mm256_mask_storeu_epi16(out + t, m, _mm512_cvtepi32_epi16(bits(_mm512_maskz_loadu_ps(m, x + t))));
    }
  }
  static void round_pairs(const float* even, const float* odd, int64_t n, uint32_t* out) {
    for (int64_t q = 0; q < n; q += 16) {
      const __mmask16 m = first(n - q);
      __m512i v = bits(_mm512_maskz_loadu_ps(m, even + q));
      if (odd) v = _mm512_or_si512(v, _mm512_slli_epi32(bits(_mm512_maskz_loadu_ps(m, odd + q)), 16));
      _mm512_mask_storeu_epi32(out + q, m, v);
    }
  }
  // dst[c * ds + r] = src[r * ss + c] for a 16 x 16 block of pairs (32-bit elements).
  static void transpose_pairs(const uint32_t* src, int64_t ss, uint32_t* dst, int64_t ds) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ss);
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    // r[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
    for (int g = 0; g < 16; g += 4) {
      r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
      r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
      r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
      r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
      const __m512i x2 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee), x3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
      _mm512_storeu_si512(dst + (0 + c) * ds, _mm512_shuffle_i32x4(x0, x1, 0x88));
      _mm512_storeu_si512(dst + (4 + c) * ds, _mm512_shuffle_i32x4(x0, x1, 0xdd));
      _mm512_storeu_si512(dst + (8 + c) * ds, _mm512_shuffle_i32x4(x2, x3, 0x88));
      _mm512_storeu_si512(dst + (12 + c) * ds, _mm512_shuffle_i32x4(x2, x3, 0xdd));
    }
  }
};


}  // namespace
}  // namespace corelm::kernels::avx512_bf16
