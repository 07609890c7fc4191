// AVX-512 VNNI int8 linear: vpdpbusd of u8 activations (q + 128) with s8 weights, 4 products per
// 32-bit lane per instruction, int32 accumulation; then the offset compensation and the fp32
// epilogue of reference/linear_int8.h (one FMA per output). Integer sums are exact, so the tile
// shape never changes a result: outputs equal the scalar reference bit for bit.
//
// Tiles: 6 rows x 64 columns (24 zmm accumulators) for batches; when 3 or fewer rows are left
// (decode), 1-3 rows x 128 columns over two panels, so one row still keeps 8 chains in flight.
// GCC 12 reports the deliberately undefined vectors inside its own AVX-512 intrinsics (set1,
// masked loads, reductions) as uninitialized (GCC bug 105593): silence that false positive here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/linear_int8.h"

namespace corelm::kernels::avx512_bf16 {
namespace {

__mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// max |x_t| over k values, and whether all are finite (exact: max does not round).
float abs_max(const float* x, int64_t k, bool& finite) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  __m512 m = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t t = 0; t < k; t += 16) {
    const __m512 v = _mm512_and_ps(_mm512_maskz_loadu_ps(tail_mask(k - t), x + t), sign);
    bad |= _mm512_cmpge_epi32_mask(_mm512_castps_si512(v), inf);
    m = _mm512_max_ps(m, v);
  }
  finite = bad == 0;
  return _mm512_reduce_max_ps(m);
}

}  // namespace

void quantize_rows_u8(const float* X, int64_t m, int64_t ldx, int64_t k, int64_t kp, uint8_t* xq, float* xscale) {
  for (int64_t i = 0; i < m; ++i) {
    const float* x = X + i * ldx;
    uint8_t* out = xq + i * kp;
    bool finite = true;
    const float a = abs_max(x, k, finite);
    if (a == 0.0f || !finite) {
      for (int64_t t = 0; t < kp; ++t) out[t] = 128;
      xscale[i] = finite ? 0.0f : __builtin_nanf("");
      continue;
    }
    const __m512 inv = _mm512_set1_ps(127.0f / a);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(128);
    int64_t t = 0;
    for (; t < k; t += 16) {
      const __mmask16 mask = tail_mask(k - t);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + t), inv);
      __m512i q = _mm512_cvtps_epi32(v);  // nearest-even (MXCSR default), as nearbyint
      q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), off);
      _mm_mask_storeu_epi8(out + t, mask, _mm512_cvtepi32_epi8(q));
    }
    for (t = k; t < kp; ++t) out[t] = 128;
    xscale[i] = a / 127.0f;
  }
}

namespace {

template <int MR, int NP>
void dp_tile(const LinearI8Args& a, const uint8_t* xq, const float* xs, const int8_t* panel, int64_t j0, float* y) {
  constexpr int NV = 4 * NP;
  const int64_t groups = a.kp / 4, panel_stride = a.kp * kInt8Panel;
  __m512i acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    if constexpr (MR <= 3) {
      // Decode streams weights from L2/L3 with little compute per byte: fetch ahead.
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(panel + (v / 4) * panel_stride + (g + 8) * 4 * kInt8Panel +
                                                   (v % 4) * 64),
                     _MM_HINT_T0);
    }
    __m512i wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      wv[v] = _mm512_loadu_si512(panel + (v / 4) * panel_stride + g * 4 * kInt8Panel + (v % 4) * 64);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t four;
      __builtin_memcpy(&four, xq + i * a.kp + 4 * g, sizeof four);
      const __m512i x = _mm512_set1_epi32(four);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbusd_epi32(acc[i][v], x, wv[v]);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const int64_t col = j0 + v * 16, cols = a.n - col;
    if (cols <= 0) break;
    const __mmask16 mask = tail_mask(cols);
    const __m512 ws = _mm512_maskz_loadu_ps(mask, a.wscale + col);
    const __m512i offset = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask, a.row_sum + col), 7);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + col) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][v], offset));
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(xs[i]), ws);
      _mm512_mask_storeu_ps(y + i * a.ldy + v * 16, mask, _mm512_fmadd_ps(dot, s, bias));
    }
  }
}

template <int MR, int NP>
void dp_rows(int rows, const LinearI8Args& a, const uint8_t* xq, const float* xs, const int8_t* panel, int64_t j0,
             float* y) {
  if (rows == MR) return dp_tile<MR, NP>(a, xq, xs, panel, j0, y);
  if constexpr (MR > 1) return dp_rows<MR - 1, NP>(rows, a, xq, xs, panel, j0, y);
}

}  // namespace

void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const int8_t* W = a.W;
  const int64_t panel_stride = a.kp * kInt8Panel;
  for (int64_t i = m0; i < m1;) {
    const int64_t left = m1 - i;
    const uint8_t* xr = a.xq + i * a.kp;
    const float* xs = a.xscale + i;
    float* yr = a.Y + i * a.ldy;
    if (left <= 3) {
      const int rows = static_cast<int>(left);
      int64_t p = p0;
      for (; p + 2 <= p1; p += 2)
        dp_rows<3, 2>(rows, a, xr, xs, W + p * panel_stride, p * kInt8Panel, yr + p * kInt8Panel);
      if (p < p1) dp_rows<3, 1>(rows, a, xr, xs, W + p * panel_stride, p * kInt8Panel, yr + p * kInt8Panel);
      i += left;
    } else {
      const int rows = static_cast<int>(left < 6 ? left : 6);
      for (int64_t p = p0; p < p1; ++p)
        dp_rows<6, 1>(rows, a, xr, xs, W + p * panel_stride, p * kInt8Panel, yr + p * kInt8Panel);
      i += rows;
    }
  }
}

float dpbusd_peak_loop(int64_t iters) {
  constexpr int kChains = 12;
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-1);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  __m512i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_epi32(s, acc[c]);
  return static_cast<float>(_mm512_reduce_add_epi32(s));
}

}  // namespace corelm::kernels::avx512_bf16
