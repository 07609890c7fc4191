// bf16 packed-linear building blocks shared by the per-ISA translation units (avx2, avx512,
// avx512_bf16). Internal linkage on purpose, as in gemm_f32_tiles.h: each ISA's copy is compiled
// with its own -m flags and must stay private to its translation unit.
//
// The widening kernel here (Avx2/Avx512 paths) turns each packed bf16 pair into two fp32 vectors
// (even k, odd k) and runs two FMAs per pair: per output element the chain is
// acc = fma(x[2p], w[2p], acc); acc = fma(x[2p+1], w[2p+1], acc) for p = 0, 1, ... in order.
#pragma once
#include <cstdint>

#include "kernels/cpu/gemm_paths.h"

namespace corelm::kernels {
namespace {

// The bf16 bit pattern of f with round-to-nearest-even and NaN kept NaN: the same rule as
// corelm::float_to_bf16 (dtype.h), restated so no shared inline code is compiled here.
inline uint32_t bf16_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// Rows [m0, m1) of X rounded to bf16 and widened back to fp32, zero-padded to kp columns:
// out[(i - m0) * kp + t].
inline void round_rows_f32(const LinearBf16Args& a, int64_t m0, int64_t m1, float* out) {
  for (int64_t i = m0; i < m1; ++i) {
    const float* x = a.X + i * a.ldx;
    float* o = out + (i - m0) * a.kp;
    for (int64_t t = 0; t < a.k; ++t) {
      const uint32_t bits = bf16_bits(x[t]) << 16;
      __builtin_memcpy(o + t, &bits, sizeof bits);
    }
    for (int64_t t = a.k; t < a.kp; ++t) o[t] = 0.0f;
  }
}

// V provides kWidth, Reg, zero(), set1, broadcast(const float*), fmadd, add, store, store_n,
// load_n(const float*, int) and widen(const uint16_t* pairs, Reg& even, Reg& odd) which splits
// kWidth packed (even, odd) bf16 pairs into two fp32 vectors.
//
// The tile covers MR rows and NV * kWidth columns starting at column j0 (a multiple of kWidth);
// it may span panels (the decode tile does).
template <class V, int MR, int NV>
void widen_tile(const LinearBf16Args& a, const float* xr, int64_t j0, float* y) {
  const int64_t n_valid = a.n - j0;
  using Reg = typename V::Reg;
  constexpr int W = V::kWidth;
  Reg acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  const uint16_t* w[NV];
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const int64_t col = j0 + j * W;
    w[j] = a.W + (col / kLinearPanel) * a.kp * kLinearPanel + (col % kLinearPanel) * 2;
  }
  for (int64_t p = 0; p < a.kp / 2; ++p) {
    // One weight vector at a time, so only its even/odd halves are live next to the accumulators.
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      Reg even, odd;
      V::widen(w[j] + p * 2 * kLinearPanel, even, odd);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = V::fmadd(V::broadcast(xr + i * a.kp + 2 * p), even, acc[i][j]);
        acc[i][j] = V::fmadd(V::broadcast(xr + i * a.kp + 2 * p + 1), odd, acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const int64_t cols = n_valid - j * W;
      if (cols <= 0) break;
      Reg r = acc[i][j];
      if (a.bias)
        r = V::add(r, cols >= W ? V::load(a.bias + j0 + j * W) : V::load_n(a.bias + j0 + j * W, static_cast<int>(cols)));
      if (cols >= W)
        V::store(y + i * a.ldy + j * W, r);
      else
        V::store_n(y + i * a.ldy + j * W, r, static_cast<int>(cols));
    }
  }
}

template <class V, int MR, int NV>
void widen_rows(int rows, const LinearBf16Args& a, const float* xr, int64_t j0, float* y) {
  if (rows == MR) return widen_tile<V, MR, NV>(a, xr, j0, y);
  if constexpr (MR > 1) return widen_rows<V, MR - 1, NV>(rows, a, xr, j0, y);
}

// MR x NV tiles for batches; when at most 3 rows are left (decode), tiles of 1-3 rows x
// 2 * NV vectors, so a single row still keeps 2 * NV independent chains in flight. Each
// element's chain is the same in both shapes.
template <class V, int MR, int NV>
void widen_block(const LinearBf16Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* scratch,
                 bool x_ready) {
  constexpr int64_t NR = NV * V::kWidth;
  static_assert(kLinearPanel % NR == 0, "a panel holds whole column tiles");
  float* xr = static_cast<float*>(scratch);
  if (!x_ready) round_rows_f32(a, m0, m1, xr);
  const int64_t c0 = p0 * kLinearPanel, c1 = p1 * kLinearPanel < a.n ? p1 * kLinearPanel : a.n;
  for (int64_t i = m0; i < m1;) {
    const int64_t left = m1 - i;
    const float* xi = xr + (i - m0) * a.kp;
    float* yi = a.Y + i * a.ldy;
    if (left <= 3) {
      int64_t j = c0;
      for (; j + 2 * NR <= c1 || (j + NR < c1 && j + 2 * NR <= p1 * kLinearPanel); j += 2 * NR)
        widen_rows<V, 3, 2 * NV>(static_cast<int>(left), a, xi, j, yi + j);
      for (; j < c1; j += NR) widen_rows<V, 3, NV>(static_cast<int>(left), a, xi, j, yi + j);
      i += left;
    } else {
      const int rows = static_cast<int>(left < MR ? left : MR);
      for (int64_t j = c0; j < c1; j += NR) widen_rows<V, MR, NV>(rows, a, xi, j, yi + j);
      i += rows;
    }
  }
}

}  // namespace
}  // namespace corelm::kernels
