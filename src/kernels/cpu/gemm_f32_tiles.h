// Register-blocked fp32 GEMM block, written once over a small vector-traits type V and included
// by the per-ISA translation units (avx2/gemm_f32.cc, avx512/gemm_f32.cc). Everything here has
// internal linkage (anonymous namespace) on purpose: each ISA's copy is compiled with different
// -m flags and must stay private to its translation unit.
//
// V provides: kWidth, Reg, zero(), set1(float), load(const float*), load_n(const float*, int),
// broadcast(const float*), fmadd(a, b, c) = a * b + c (fused), mul, add, store, store_n.
//
// Layout: op(B) is packed one panel of NR = NV * kWidth columns by kGemmKBlock k-steps at a time,
// k-major (panel[k * NR + j]), zero-padded to NR; A is read in place (rows or, when transposed,
// columns).
// Every C element is one fused multiply-add chain over k = 0..K-1 starting at zero, in every tile
// shape, so row tiles of any height give bitwise identical rows.
#pragma once
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_paths.h"

namespace corelm::kernels {
namespace {

// One MR x NR tile over one k-block of K steps. The accumulators start at zero or, for a later
// k-block, from `carry_in` (the exact fp32 values the previous k-block stored), so splitting K
// into blocks leaves each element's FMA chain unchanged. With `carry_out` the accumulators are
// stored there for the next k-block; without it the epilogue writes C.
template <class V, int MR, int NV, bool TransA>
void f32_tile(int64_t K, const float* a, int64_t lda, const float* panel, const GemmF32Args& g, float* c,
              int64_t n_valid, const float* carry_in, float* carry_out) {
  using Reg = typename V::Reg;
  constexpr int W = V::kWidth, NR = NV * W;
  Reg acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = carry_in ? V::load(carry_in + i * NR + j * W) : V::zero();

  if constexpr (TransA) {
    // A stored K x M: the MR values of step k are contiguous.
    for (int64_t k = 0; k < K; ++k, a += lda, panel += NR) {
      Reg b[NV];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) b[j] = V::load(panel + j * W);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const Reg x = V::broadcast(a + i);
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[i][j] = V::fmadd(x, b[j], acc[i][j]);
      }
    }
  } else {
    const float* rows[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) rows[i] = a + i * lda;
    for (int64_t k = 0; k < K; ++k, panel += NR) {
      Reg b[NV];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) b[j] = V::load(panel + j * W);
      // The MR rows of A are MR separate streams; fetch each one a few cache lines ahead.
      if ((k & 15) == 0)
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) _mm_prefetch(reinterpret_cast<const char*>(rows[i] + k + 64), _MM_HINT_T0);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const Reg x = V::broadcast(rows[i] + k);
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[i][j] = V::fmadd(x, b[j], acc[i][j]);
      }
    }
  }

  if (carry_out) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) V::store(carry_out + i * NR + j * W, acc[i][j]);
    return;
  }
  // Epilogue, the same for full and edge tiles: C = alpha * acc (+ beta * C).
  const bool scale = g.alpha != 1.0f, accumulate = g.beta != 0.0f;
  const Reg alpha = V::set1(g.alpha), beta = V::set1(g.beta);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* crow = c + i * g.ldc;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const int64_t cols = n_valid - j * W;
      if (cols <= 0) break;
      Reg r = acc[i][j];
      if (scale) r = V::mul(alpha, r);
      if (accumulate) {
        const Reg old = cols >= W ? V::load(crow + j * W) : V::load_n(crow + j * W, static_cast<int>(cols));
        r = V::add(r, V::mul(beta, old));
      }
      if (cols >= W)
        V::store(crow + j * W, r);
      else
        V::store_n(crow + j * W, r, static_cast<int>(cols));
    }
  }
}

// dst[r * ldd + c] = src[c * lds + r] for an 8 x 8 block.
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// Copies op(B)[k0 .. k0 + K, j0 .. j0 + cols) into one NR-wide panel (k-major, zero-padded).
template <int NR>
void pack_b_panel(const GemmF32Args& g, int64_t j0, int64_t cols, int64_t k0, int64_t K, float* dst) {
  if (!g.trans_b) {
    for (int64_t k = 0; k < K; ++k) {
      std::memcpy(dst + k * NR, g.B + (k0 + k) * g.ldb + j0, static_cast<size_t>(cols) * sizeof(float));
      for (int64_t j = cols; j < NR; ++j) dst[k * NR + j] = 0.0f;
    }
    return;
  }
  // B stored N x K: transposed in 8 x 8 blocks (AVX shuffles; every ISA folder using this file
  // has AVX2), the ragged edges element by element.
  const int64_t j8 = cols / 8 * 8, k8 = K / 8 * 8;
  for (int64_t j = 0; j < j8; j += 8) {
    const float* src = g.B + (j0 + j) * g.ldb + k0;
    for (int64_t k = 0; k < k8; k += 8) transpose8x8(src + k, g.ldb, dst + k * NR + j, NR);
    for (int64_t k = k8; k < K; ++k)
      for (int64_t t = 0; t < 8; ++t) dst[k * NR + j + t] = src[t * g.ldb + k];
  }
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = j8; j < cols; ++j) dst[k * NR + j] = g.B[(j0 + j) * g.ldb + k0 + k];
    for (int64_t j = cols; j < NR; ++j) dst[k * NR + j] = 0.0f;
  }
}

// The tile for `rows` (1..MR) rows: row edges use a shorter tile with the same per-element chain.
template <class V, int MR, int NV, bool TransA>
void f32_rows(int rows, int64_t K, const float* a, int64_t lda, const float* panel, const GemmF32Args& g,
              float* c, int64_t n_valid, const float* carry_in, float* carry_out) {
  if (rows == MR) return f32_tile<V, MR, NV, TransA>(K, a, lda, panel, g, c, n_valid, carry_in, carry_out);
  if constexpr (MR > 1)
    return f32_rows<V, MR - 1, NV, TransA>(rows, K, a, lda, panel, g, c, n_valid, carry_in, carry_out);
}

// Block loop: for each NR-wide panel, for each k-block (the packed kGemmKBlock x NR panel stays in
// L1 while every row tile of the block passes over it), for each row tile.
template <class V, int MR, int NV, bool TransA>
void f32_block_loop(const GemmF32Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* scratch) {
  constexpr int64_t NR = NV * V::kWidth;
  float* panel = scratch;
  float* carry = scratch + kGemmKBlock * NR;  // row-block x NR accumulators between k-blocks
  const int64_t kblocks = g.K > 0 ? (g.K + kGemmKBlock - 1) / kGemmKBlock : 1;
  for (int64_t j0 = n0; j0 < n1; j0 += NR) {
    const int64_t cols = n1 - j0 < NR ? n1 - j0 : NR;
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const int64_t k0 = kb * kGemmKBlock, kc = g.K - k0 < kGemmKBlock ? g.K - k0 : kGemmKBlock;
      pack_b_panel<NR>(g, j0, cols, k0, kc, panel);
      for (int64_t i = m0; i < m1; i += MR) {
        const int rows = static_cast<int>(m1 - i < MR ? m1 - i : MR);
        const float* a = TransA ? g.A + k0 * g.lda + i : g.A + i * g.lda + k0;
        float* tile_carry = carry + (i - m0) * NR;
        f32_rows<V, MR, NV, TransA>(rows, kc, a, g.lda, panel, g, g.C + i * g.ldc + j0, n1 - j0,
                                    kb > 0 ? tile_carry : nullptr, kb + 1 < kblocks ? tile_carry : nullptr);
      }
    }
  }
}

template <class V, int MR, int NV>
void f32_block(const GemmF32Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* scratch) {
  constexpr int64_t NR = NV * V::kWidth;
  static_assert(kGemmColBlock % NR == 0 && kGemmRowBlock % MR == 0, "blocks hold whole tiles");
  static_assert(NR <= kGemmMaxPanel, "scratch is sized for kGemmMaxPanel columns");
  if (g.trans_a)
    f32_block_loop<V, MR, NV, true>(g, m0, m1, n0, n1, scratch);
  else
    f32_block_loop<V, MR, NV, false>(g, m0, m1, n0, n1, scratch);
}

}  // namespace
}  // namespace corelm::kernels
