// Register-blocked bf16 GEMM block (layout and chain order: gemm_paths.h, "bf16 GEMM"), written
// once over a vector-traits type V and included by the ISA translation units that have a bf16
// pair dot product (avx512_bf16/gemm_bf16.cc). Internal linkage on purpose, as in
// gemm_f32_tiles.h: each ISA's copy is compiled with its own -m flags.
//
// V provides:
//   kWidth                       fp32 lanes per vector (= bf16 pairs per Pairs vector)
//   Reg, Pairs                   fp32 accumulator vector, vector of kWidth (even, odd) bf16 pairs
//   zero(), load, load_n, store, store_n, add      on Reg, as in gemm_f32_tiles.h
//   load_pairs(const uint32_t*)  kWidth packed pairs;  broadcast_pair(const uint32_t*) one pair
//   dot(acc, a, b)               acc + a.even * b.even + a.odd * b.odd per lane (fp32 accumulation)
//   round_row(x, n, out)         out[t] = bf16(x[t]), t < n (nearest-even, NaN stays NaN)
//   round_pairs(even, odd, n, out)  out[q] = bf16(even[q]) | bf16(odd[q]) << 16, q < n; odd may
//                                be null (zeros: the padding of an odd K)
//   transpose_pairs(src, ss, dst, ds)  dst[c * ds + r] = src[r * ss + c], r, c < kWidth (32-bit)
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_paths.h"

namespace corelm::kernels {
namespace {

// One MR x (NV * kWidth) tile over `pairs` k-pairs. a: MR rows of rounded pairs (row stride
// a_stride pairs); panel: kBf16Panel pairs per k-pair. Accumulators start at zero or from
// carry_in; with carry_out they are stored there for the next k-block, else written to C.
template <class V, int MR, int NV>
void bf16_tile(int64_t pairs, const uint32_t* a, int64_t a_stride, const uint32_t* panel, const GemmBf16Args& g,
               float* c, int64_t n_valid, const float* carry_in, float* carry_out) {
  using Reg = typename V::Reg;
  using Pairs = typename V::Pairs;
  constexpr int W = V::kWidth;
  constexpr int64_t NR = kBf16Panel;
  Reg acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = carry_in ? V::load(carry_in + i * NR + j * W) : V::zero();
  // The rows of A come from L2 or further, in runs too short for the hardware prefetcher: fetch
  // the next row tile's (the next MR rows of the same k-block) one line per row every 16 pairs.
  const uint32_t* next = a + MR * a_stride;
  for (int64_t p = 0; p < pairs; ++p, panel += NR) {
    if ((p & 15) == 0)
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) __builtin_prefetch(next + i * a_stride + p);
    Pairs b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) b[j] = V::load_pairs(panel + j * W);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const Pairs x = V::broadcast_pair(a + i * a_stride + p);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] = V::dot(acc[i][j], x, b[j]);
    }
  }
  if (carry_out) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) V::store(carry_out + i * NR + j * W, acc[i][j]);
    return;
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* crow = c + i * g.ldc;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const int64_t cols = n_valid - j * W;
      if (cols <= 0) break;
      Reg r = acc[i][j];
      if (cols >= W) {
        if (g.accumulate) r = V::add(V::load(crow + j * W), r);
        V::store(crow + j * W, r);
      } else {
        if (g.accumulate) r = V::add(V::load_n(crow + j * W, static_cast<int>(cols)), r);
        V::store_n(crow + j * W, r, static_cast<int>(cols));
      }
    }
  }
}

template <class V, int MR, int NV>
void bf16_rows(int rows, int64_t pairs, const uint32_t* a, int64_t a_stride, const uint32_t* panel,
               const GemmBf16Args& g, float* c, int64_t n_valid, const float* carry_in, float* carry_out) {
  if (rows == MR) return bf16_tile<V, MR, NV>(pairs, a, a_stride, panel, g, c, n_valid, carry_in, carry_out);
  if constexpr (MR > 1)
    return bf16_rows<V, MR - 1, NV>(rows, pairs, a, a_stride, panel, g, c, n_valid, carry_in, carry_out);
}

// Pairs [p0, p0 + pairs) of rows [m0, m1) of op(A), rounded: out[(i - m0) * stride + p - p0],
// zero-padded past K. Rows past m1 up to the next multiple of kWidth may be overwritten (the
// buffer holds kGemmRowBlock rows).
template <class V>
void bf16_pack_rows(const GemmBf16Args& g, int64_t m0, int64_t m1, int64_t p0, int64_t pairs, uint32_t* out,
                    int64_t stride) {
  constexpr int64_t W = V::kWidth;
  const int64_t rows = m1 - m0, k0 = 2 * p0, kn = g.K - k0 < 2 * pairs ? g.K - k0 : 2 * pairs;
  if (!g.trans_a) {
    for (int64_t i = m0; i < m1; ++i) {
      uint16_t* o = reinterpret_cast<uint16_t*>(out + (i - m0) * stride);
      // Rows of a long-K A are far apart (often in DRAM): fetch two rows ahead.
      if (i + 2 < m1)
        for (int64_t t = 0; t < kn; t += 16) __builtin_prefetch(g.A + (i + 2) * g.lda + k0 + t);
      V::round_row(g.A + i * g.lda + k0, kn, o);
      if (kn < 2 * pairs) o[kn] = 0;
    }
    return;
  }
  // A stored K x M: rows 2p and 2p + 1 of A hold pair p of consecutive rows of op(A). kRun of
  // them (four cache lines of each row of A) are gathered pair-major into `run`, then transposed
  // kWidth x kWidth at a time.
  constexpr int64_t kRun = 4 * W;
  uint32_t run[kBf16KPairs * kRun];
  for (int64_t r0 = 0; r0 < rows; r0 += kRun) {
    const int64_t n = rows - r0 < kRun ? rows - r0 : kRun;
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t k = k0 + 2 * p;
      const float* even = g.A + k * g.lda + m0 + r0;
      V::round_pairs(even, k + 1 < g.K ? even + g.lda : nullptr, n, run + p * kRun);
    }
    for (int64_t s0 = 0; s0 < n; s0 += W) {
      const int64_t sn = n - s0 < W ? n - s0 : W;
      uint32_t* o = out + (r0 + s0) * stride;
      int64_t p = 0;
      for (; p + W <= pairs; p += W) V::transpose_pairs(run + p * kRun + s0, kRun, o + p, stride);
      for (; p < pairs; ++p)  // the last pairs of a row: a full transpose would spill into the next row
        for (int64_t r = 0; r < sn; ++r) o[r * stride + p] = run[p * kRun + s0 + r];
    }
  }
}

// Pairs [p0, p0 + pairs) of op(B) columns [j0, j0 + cols) into one panel, zero past cols. Rows of
// the panel past `pairs` up to the next multiple of kWidth may be overwritten.
template <class V>
void bf16_pack_panel(const GemmBf16Args& g, int64_t j0, int64_t cols, int64_t p0, int64_t pairs, uint32_t* panel) {
  constexpr int64_t NR = kBf16Panel, W = V::kWidth;
  if (!g.trans_b) {
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t k = 2 * (p0 + p);
      const float* even = g.B + k * g.ldb + j0;
      if (k + 5 < g.K)
        for (int64_t t = 0; t < cols; t += 16) {
          __builtin_prefetch(even + 4 * g.ldb + t);
          __builtin_prefetch(even + 5 * g.ldb + t);
        }
      V::round_pairs(even, k + 1 < g.K ? even + g.ldb : nullptr, cols, panel + p * NR);
      std::memset(panel + p * NR + cols, 0, static_cast<size_t>(NR - cols) * 4);
    }
    return;
  }
  // B stored N x K: column j of op(B) is contiguous over k, so its pairs come out in order; kWidth
  // columns are rounded side by side (missing ones as zeros), then transposed into the panel.
  const int64_t k0 = 2 * p0, kn = g.K - k0 < 2 * pairs ? g.K - k0 : 2 * pairs;
  const int64_t padded = (pairs + W - 1) / W * W;
  uint32_t col[W * kBf16KPairs];
  for (int64_t jg = 0; jg < NR; jg += W) {
    if (jg >= cols) {
      for (int64_t p = 0; p < padded; ++p) std::memset(panel + p * NR + jg, 0, W * 4);
      continue;
    }
    for (int64_t j = 0; j < W; ++j) {
      uint32_t* c = col + j * kBf16KPairs;
      if (jg + j >= cols) {
        std::memset(c, 0, static_cast<size_t>(padded) * 4);
        continue;
      }
      uint16_t* c16 = reinterpret_cast<uint16_t*>(c);
      V::round_row(g.B + (j0 + jg + j) * g.ldb + k0, kn, c16);
      for (int64_t t = kn; t < 2 * padded; ++t) c16[t] = 0;
    }
    for (int64_t p = 0; p < padded; p += W) V::transpose_pairs(col + p, kBf16KPairs, panel + p * NR + jg, NR);
  }
}

// K in blocks of kBf16KPairs (outermost, so a block of rounded rows stays in L2 while every panel
// of the task passes over it), then panels, then row tiles; each panel's accumulators are carried
// exactly between k-blocks. With a single k-block the rows are packed once per task and may be
// reused by the next column block of the same rows (rows_ready).
template <class V, int MR>
void bf16_block(const GemmBf16Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch,
                bool rows_ready) {
  constexpr int NV = kBf16Panel / V::kWidth;
  static_assert(kGemmColBlock % kBf16Panel == 0 && kGemmRowBlock % MR == 0, "blocks hold whole tiles");
  const int64_t stride = gemm_bf16_row_stride(g.kp), pairs_k = g.kp / 2;
  const int64_t kblocks = (pairs_k + kBf16KPairs - 1) / kBf16KPairs;
  uint32_t* rows = static_cast<uint32_t*>(scratch);
  uint32_t* panel = reinterpret_cast<uint32_t*>(static_cast<char*>(scratch) + gemm_bf16_rows_bytes(g.kp));
  float* carry = reinterpret_cast<float*>(panel + kBf16KPairs * kBf16Panel);
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const int64_t p0 = kb * kBf16KPairs, pairs = pairs_k - p0 < kBf16KPairs ? pairs_k - p0 : kBf16KPairs;
    if (kblocks > 1 || !rows_ready) bf16_pack_rows<V>(g, m0, m1, p0, pairs, rows, stride);
    for (int64_t j0 = n0; j0 < n1; j0 += kBf16Panel) {
      const int64_t cols = n1 - j0 < kBf16Panel ? n1 - j0 : kBf16Panel;
      float* panel_carry = carry + ((j0 - n0) / kBf16Panel) * kGemmRowBlock * kBf16Panel;
      bf16_pack_panel<V>(g, j0, cols, p0, pairs, panel);
      for (int64_t i = m0; i < m1; i += MR) {
        const int r = static_cast<int>(m1 - i < MR ? m1 - i : MR);
        float* tile_carry = panel_carry + (i - m0) * kBf16Panel;
        bf16_rows<V, MR, NV>(r, pairs, rows + (i - m0) * stride, stride, panel, g, g.C + i * g.ldc + j0, cols,
                             kb > 0 ? tile_carry : nullptr, kb + 1 < kblocks ? tile_carry : nullptr);
      }
    }
  }
}

}  // namespace
}  // namespace corelm::kernels
