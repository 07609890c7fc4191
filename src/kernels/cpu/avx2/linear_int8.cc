// AVX2 int8 linear for CPUs without AVX-512 VNNI (Haswell to Zen3, and AVX-512 cores before
// Cascade Lake). There is no u8 x s8 -> s32 instruction here; vpmaddubsw multiplies u8 by s8 and
// adds adjacent pairs into a *saturating* s16. With the u8 = q + 128 operand of the VNNI path a
// pair can reach 2 * 255 * 127 and saturate, so this kernel uses the signed quantized values
// instead: |q_x| (at most 127, as u8) times sign(q_x) * q_w (s8), whose pair sums stay within
// 2 * 127 * 127 = 32258. vpmaddwd by ones then adds the pairs into the int32 lane of the 4 k of a
// group. Every sum is exact, so the outputs equal the scalar reference bit for bit, as VNNI's do.
//
// Layout: the VNNI panel layout (linear_int8.h), 8 columns per ymm. Tiles: 4 rows x 16 columns
// for batches, 1-2 rows x 32 columns for decode.
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/linear_int8.h"

namespace corelm::kernels::avx2 {
namespace {

// The activation group of row i at group g as s8: the u8 operand stores q + 128.
__m256i signed_group(const uint8_t* xq, int64_t g) {
  int32_t four;
  __builtin_memcpy(&four, xq + 4 * g, sizeof four);
  return _mm256_xor_si256(_mm256_set1_epi32(four), _mm256_set1_epi8(static_cast<char>(0x80)));
}

template <int MR, int NV>
void dp_tile(const LinearI8Args& a, const uint8_t* xq, const float* xs, const int8_t* w, int64_t j0, float* y) {
  const int64_t groups = a.kp / 4;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MR][NV];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_si256();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      wv[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 4 * kInt8Panel + v * 32));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256i x = signed_group(xq + i * a.kp, g);
      const __m256i x_abs = _mm256_sign_epi8(x, x);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(wv[v], x));
        acc[i][v] = _mm256_add_epi32(acc[i][v], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int64_t col = j0 + v * 8, cols = a.n - col;
    if (cols <= 0) break;
    alignas(32) float ws[8] = {}, bias[8] = {}, out[8];
    for (int64_t c = 0; c < 8 && c < cols; ++c) {
      ws[c] = a.wscale[col + c];
      bias[c] = a.bias ? a.bias[col + c] : 0.0f;
    }
    const __m256 wsv = _mm256_load_ps(ws), bv = _mm256_load_ps(bias);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][v]), _mm256_mul_ps(_mm256_set1_ps(xs[i]), wsv), bv);
      float* yi = y + i * a.ldy + v * 8;
      if (cols >= 8) {
        _mm256_storeu_ps(yi, r);
      } else {
        _mm256_store_ps(out, r);
        for (int64_t c = 0; c < cols; ++c) yi[c] = out[c];
      }
    }
  }
}

template <int MR, int NV>
void dp_rows(int rows, const LinearI8Args& a, const uint8_t* xq, const float* xs, const int8_t* w, int64_t j0,
             float* y) {
  if (rows == MR) return dp_tile<MR, NV>(a, xq, xs, w, j0, y);
  if constexpr (MR > 1) return dp_rows<MR - 1, NV>(rows, a, xq, xs, w, j0, y);
}

// Column tiles of 8 * NV columns over panels [p0, p1) for `rows` rows starting at row i.
template <int MR, int NV>
void row_strip(int rows, const LinearI8Args& a, int64_t i, int64_t p0, int64_t p1) {
  constexpr int64_t cols = 8 * NV;
  static_assert(kInt8Panel % cols == 0, "a panel holds whole column tiles");
  const int64_t c1 = p1 * kInt8Panel < a.n ? p1 * kInt8Panel : a.n;
  for (int64_t c = p0 * kInt8Panel; c < c1; c += cols) {
    const int8_t* w = a.W + (c / kInt8Panel) * a.kp * kInt8Panel + (c % kInt8Panel) * 4;
    dp_rows<MR, NV>(rows, a, a.xq + i * a.kp, a.xscale + i, w, c, a.Y + i * a.ldy + c);
  }
}

}  // namespace

void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for (int64_t i = m0; i < m1;) {
    const int64_t left = m1 - i;
    if (left <= 2) {
      row_strip<2, 4>(static_cast<int>(left), a, i, p0, p1);
      i += left;
    } else {
      const int rows = static_cast<int>(left < 4 ? left : 4);
      row_strip<4, 2>(rows, a, i, p0, p1);
      i += rows;
    }
  }
}

}  // namespace corelm::kernels::avx2
