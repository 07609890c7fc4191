// The 4-bit linear's tile loops, written once over vector traits and instantiated by the AVX2
// (avx2/linear_q4.cc) and AVX-512 VNNI (avx512_bf16/linear_q4.cc) translation units. Internal
// linkage on purpose, as in linear_bf16_tiles.h: each copy is compiled with its own -m flags.
//
// Per output lane the fp32 work is exactly reference/linear_q4.h's: for each block in order, one
// exact integer dot, then the same one (Symmetric) or two (WithMin) FMAs; so every path is bitwise
// equal to the reference. The loops read the codes of NP panels once per tile of MR rows: a batch-1
// decode streams every weight byte once, which is the point of 4-bit weights.
//
// V provides kLanes (int32 lanes per vector), F / I / IAcc register types, load_codes (kLanes * 4
// bytes), low / high (the 4-bit halves as u8), acc_zero, dot(IAcc, u8 codes, four s8 activations
// as an int32), finish(IAcc) -> int32 lanes, cvt (int32 -> fp32), sub_i32(I, scalar),
// load_f16 (kLanes fp16 -> fp32), set1, zero, mul, add, fmadd, load_n, store_n.
#pragma once
#include <cstdint>

#include "kernels/cpu/linear_q4.h"

namespace corelm::kernels {
namespace {

template <class V, int MR, int NP, bool kWithMin>
void q4_tile(const LinearQ4Args& a, int64_t i0, int64_t p0) {
  constexpr int VP = static_cast<int>(kQ4Panel) / V::kLanes, NV = NP * VP;
  constexpr int64_t kBlockBytes = kQ4Block * kQ4Panel / 2;
  const int64_t nb = a.nb, kp = a.kp;
  typename V::F acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
  for (int64_t b = 0; b < nb; ++b) {
    typename V::IAcc dot[MR][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) dot[i][v] = V::acc_zero();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      int32_t x_lo[MR], x_hi[MR];  // activations 8g..8g+3 and 8g+4..8g+7 of the block, four s8 each
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const int8_t* x = a.xq + (i0 + i) * kp + b * kQ4Block + g * 8;
        __builtin_memcpy(&x_lo[i], x, 4);
        __builtin_memcpy(&x_hi[i], x + 4, 4);
      }
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p)
#pragma GCC unroll 4
        for (int v = 0; v < VP; ++v) {
          const uint8_t* src = a.codes + ((p0 + p) * nb + b) * kBlockBytes + g * 64 + v * V::kLanes * 4;
          const typename V::I raw = V::load_codes(src), lo = V::low(raw), hi = V::high(raw);
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            dot[i][p * VP + v] = V::dot(dot[i][p * VP + v], lo, x_lo[i]);
            dot[i][p * VP + v] = V::dot(dot[i][p * VP + v], hi, x_hi[i]);
          }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < VP; ++v) {
        const int64_t s = ((p0 + p) * nb + b) * kQ4Panel + v * V::kLanes;
        const typename V::F d = V::load_f16(a.scale + s);
        typename V::F m = V::zero();
        if constexpr (kWithMin) m = V::load_f16(a.min + s);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const float xs = a.xscale[(i0 + i) * nb + b];
          const int32_t xsum = a.xsum[(i0 + i) * nb + b];
          const typename V::I sum = V::finish(dot[i][p * VP + v]);
          typename V::F& y = acc[i][p * VP + v];
          if constexpr (kWithMin) {
            y = V::fmadd(V::cvt(sum), V::mul(V::set1(xs), d), y);
            y = V::fmadd(V::set1(static_cast<float>(xsum)), V::mul(V::set1(xs), m), y);
          } else {
            y = V::fmadd(V::cvt(V::sub_i32(sum, 8 * xsum)), V::mul(V::set1(xs), d), y);
          }
        }
      }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const int64_t col = (p0 + v / VP) * kQ4Panel + (v % VP) * V::kLanes, cols = a.n - col;
    if (cols <= 0) break;
    const int live = cols < V::kLanes ? static_cast<int>(cols) : V::kLanes;
    const typename V::F bias = a.bias ? V::load_n(a.bias + col, live) : V::zero();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) V::store_n(a.Y + (i0 + i) * a.ldy + col, V::add(acc[i][v], bias), live);
  }
}

// The MR-row tile for `rows` (1..MR) rows.
template <class V, int MR, int NP, bool kWithMin>
void q4_rows(int rows, const LinearQ4Args& a, int64_t i0, int64_t p0) {
  if (rows == MR) return q4_tile<V, MR, NP, kWithMin>(a, i0, p0);
  if constexpr (MR > 1) return q4_rows<V, MR - 1, NP, kWithMin>(rows, a, i0, p0);
}

// Panels [p0, p1) for `rows` rows from i0: NP panels at a time, then single panels.
template <class V, int MR, int NP, bool kWithMin>
void q4_strip(int rows, const LinearQ4Args& a, int64_t i0, int64_t p0, int64_t p1) {
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) q4_rows<V, MR, NP, kWithMin>(rows, a, i0, p);
  for (; p < p1; ++p) q4_rows<V, MR, 1, kWithMin>(rows, a, i0, p);
}

// Rows [m0, m1) x panels [p0, p1): strips of kDecodeRows rows x kDecodePanels panels while few rows
// are left (decode: more panels per row keep more independent chains in flight), else kRows x kPanels.
template <class V, int kRows, int kPanels, int kDecodeRows, int kDecodePanels, bool kWithMin>
void q4_block(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for (int64_t i = m0; i < m1;) {
    const int64_t left = m1 - i;
    if (left <= kDecodeRows) {
      q4_strip<V, kDecodeRows, kDecodePanels, kWithMin>(static_cast<int>(left), a, i, p0, p1);
      i += left;
    } else {
      const int rows = static_cast<int>(left < kRows ? left : kRows);
      q4_strip<V, kRows, kPanels, kWithMin>(rows, a, i, p0, p1);
      i += rows;
    }
  }
}

// The AVX-512 VNNI kernel's tile shapes (1-2 rows x 4 panels for decode, 3-4 rows x 2 panels
// otherwise), shared with its emulation on machines without AVX-512 (linear_q4_emulation.cc).
template <class V>
void q4_block_vnni_shapes(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  if (a.min)
    q4_block<V, 4, 2, 2, 4, true>(a, m0, m1, p0, p1);
  else
    q4_block<V, 4, 2, 2, 4, false>(a, m0, m1, p0, p1);
}

}  // namespace
}  // namespace corelm::kernels
