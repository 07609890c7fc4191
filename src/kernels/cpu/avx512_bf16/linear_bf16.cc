// AVX-512 BF16 packed linear: vdpbf16ps on the interleaved (even k, odd k) weight pairs, fp32
// accumulation. Per output element the chain is acc = dpbf16(acc, x pair p, w pair p) for
// p = 0, 1, ... in order, whatever the tile shape below, so rows are batch invariant.
//
// Tiles: 6 rows x 64 columns (24 zmm accumulators) for prefill/batched rows; when 3 or fewer
// rows are left (decode), 1-3 rows x 128 columns over two panels at once, so even one row keeps
// 8 independent accumulation chains in flight while the weights stream past.
// GCC 12 reports the deliberately undefined vectors inside its own AVX-512 intrinsics as
// uninitialized (GCC bug 105593) once round_rows_bf16 is compiled out of line: a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/linear_bf16_tiles.h"

namespace corelm::kernels::avx512_bf16 {
namespace {

// Round 16 floats to bf16 bit patterns (nearest-even, NaN kept quiet NaN) as in bf16_bits().
__m256i round16(const float* x) {
  const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

}  // namespace

// Consecutive (even, odd) values of a row form the 32-bit pairs vdpbf16ps multiplies.
void round_rows_bf16(const LinearBf16Args& a, int64_t m0, int64_t m1, uint16_t* out) {
  for (int64_t i = m0; i < m1; ++i) {
    const float* x = a.X + i * a.ldx;
    uint16_t* o = out + (i - m0) * a.kp;
    int64_t t = 0;
    for (; t + 16 <= a.k; t += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + t), round16(x + t));
    for (; t < a.k; ++t) o[t] = static_cast<uint16_t>(bf16_bits(x[t]));
    for (; t < a.kp; ++t) o[t] = 0;
  }
}

namespace {

__m512bh pair_broadcast(const uint16_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(v));
}

template <int MR, int NP>
void dp_tile(const LinearBf16Args& a, const uint16_t* xb, const uint16_t* panel, int64_t j0, float* y) {
  constexpr int NV = 4 * NP;
  const int64_t pairs = a.kp / 2, panel_stride = a.kp * kLinearPanel;
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      w[v] = (__m512bh)_mm512_loadu_si512(panel + (v / 4) * panel_stride + p * 2 * kLinearPanel + (v % 4) * 32);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh x = pair_broadcast(xb + i * a.kp + 2 * p);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], x, w[v]);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const int64_t col = j0 + v * 16, cols = a.n - col;
    if (cols <= 0) break;
    const __mmask16 mask = cols >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << cols) - 1);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + col) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 r = a.bias ? _mm512_add_ps(acc[i][v], bias) : acc[i][v];
      _mm512_mask_storeu_ps(y + i * a.ldy + v * 16, mask, r);
    }
  }
}

template <int MR, int NP>
void dp_rows(int rows, const LinearBf16Args& a, const uint16_t* xb, const uint16_t* panel, int64_t j0, float* y) {
  if (rows == MR) return dp_tile<MR, NP>(a, xb, panel, j0, y);
  if constexpr (MR > 1) return dp_rows<MR - 1, NP>(rows, a, xb, panel, j0, y);
}

}  // namespace

void linear_bf16_block(const LinearBf16Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready) {
  uint16_t* xb = static_cast<uint16_t*>(xbuf);
  if (!x_ready) round_rows_bf16(a, m0, m1, xb);
  const int64_t panel_stride = a.kp * kLinearPanel;
  for (int64_t i = m0; i < m1;) {
    const int64_t left = m1 - i;
    const uint16_t* xr = xb + (i - m0) * a.kp;
    float* yr = a.Y + i * a.ldy;
    if (left <= 3) {
      const int rows = static_cast<int>(left);
      int64_t p = p0;
      for (; p + 2 <= p1; p += 2)
        dp_rows<3, 2>(rows, a, xr, a.W + p * panel_stride, p * kLinearPanel, yr + p * kLinearPanel);
      if (p < p1) dp_rows<3, 1>(rows, a, xr, a.W + p * panel_stride, p * kLinearPanel, yr + p * kLinearPanel);
      i += left;
    } else {
      const int rows = static_cast<int>(left < 6 ? left : 6);
      for (int64_t p = p0; p < p1; ++p)
        dp_rows<6, 1>(rows, a, xr, a.W + p * panel_stride, p * kLinearPanel, yr + p * kLinearPanel);
      i += rows;
    }
  }
}

}  // namespace corelm::kernels::avx512_bf16
