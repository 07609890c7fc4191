// AMX tile kernels for the packed linears (bf16: tdpbf16ps, int8: tdpbusd), written once against
// a tile "machine" T so the same loops run on two backends:
//   - amx/linear_tiles.cc: T = the real tile registers (compiled with -mamx-* flags, run on CPUs
//     that have AMX and granted the tile state);
//   - tile_emulation.cc: T = eight 1 KiB arrays and the instruction semantics in plain C++, so
//     the blocking, packing offsets, padding and epilogues are tested on every machine.
// Internal linkage on purpose (as linear_bf16_tiles.h): each translation unit keeps its own copy.
//
// T provides: configure() / release() (the one tile shape below), and with tile ids as template
// arguments zero<C>(), load<t>(ptr, stride_bytes), store<t>(ptr, stride_bytes),
// dp_bf16<C, A, B>(), dp_u8s8<C, A, B>().
//
// Tile shape: every tile is 16 rows x 64 bytes. C tiles 0-3 hold 16 x 16 fp32 / int32 sums;
// A tiles 4-5 hold 16 activation rows x 32 bf16 (or 64 u8); B tiles 6-7 hold 16 k-pairs x 16
// columns (or 16 k-quads x 16 columns).
//
// Weights use the panel layouts of the AVX-512 kernels unchanged (gemm_paths.h, linear_int8.h):
// within a 64-column panel, the 16 columns starting at c of k-pair (or quad) g are 64 contiguous
// bytes at g * 256 + c * 4, so a B tile is one strided load (stride 256 bytes). K is padded with
// zeros to whole tiles (32 bf16 / 64 int8) when packing for Amx; activations are padded to 16-row
// multiples by the caller. Rows never mix inside a tile, and each output element's sum runs over
// the k tiles in order from zero, so results are batch invariant exactly as on the other paths.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/gemm_bf16_tiles.h"
#include "kernels/cpu/gemm_paths.h"
#include "kernels/cpu/linear_int8.h"

namespace corelm::kernels {
namespace {

inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kTileBytes = 64;
inline constexpr int64_t kTileKBf16 = 32;  // bf16 values of one activation row in an A tile
inline constexpr int64_t kTileKInt8 = 64;  // u8 values of one activation row in an A tile
inline constexpr int64_t kPanelRowBytes = 256;  // one k-pair (bf16) or k-quad (int8) of a panel

// The part of a tile block every backend shares: MT row tiles x NT column tiles (MT * NT <= 4)
// accumulated over all k tiles, then stored to `out` (MT*16 rows x NT*16 columns, fp32 or int32).
// A row tile i reads xa + i * 16 rows of `a_stride` bytes; column tile j reads wb[j].
template <class T, int MT, int NT, bool Int8>
void tile_block(const uint8_t* xa, int64_t a_stride, const uint8_t* const* wb, int64_t k_tiles, int32_t* out) {
  static_assert(MT >= 1 && NT >= 1 && MT * NT <= 4 && MT <= 2, "4 accumulator tiles, 2 A tiles");
  T::template zero<0>();
  if constexpr (MT * NT > 1) T::template zero<1>();
  if constexpr (MT * NT > 2) T::template zero<2>();
  if constexpr (MT * NT > 3) T::template zero<3>();
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    const uint8_t* a = xa + kt * kTileBytes;
    const int64_t b_off = kt * kTileRows * kPanelRowBytes;
    T::template load<4>(a, a_stride);
    if constexpr (MT == 2) T::template load<5>(a + kTileRows * a_stride, a_stride);
    // Column tiles alternate between B tiles 6 and 7, so a load overlaps the previous product.
    [&]<int... J>(std::integer_sequence<int, J...>) {
      (([&] {
         constexpr int b = 6 + J % 2;
         T::template load<b>(wb[J] + b_off, kPanelRowBytes);
         if constexpr (Int8) {
           T::template dp_u8s8<J, 4, b>();
           if constexpr (MT == 2) T::template dp_u8s8<NT + J, 5, b>();
         } else {
           T::template dp_bf16<J, 4, b>();
           if constexpr (MT == 2) T::template dp_bf16<NT + J, 5, b>();
         }
       }()),
       ...);
    }(std::make_integer_sequence<int, NT>{});
  }
  // C tile c = i * NT + j lands at rows i * 16, columns j * 16 of `out` (row stride NT * 16).
  const int64_t out_stride = NT * 16 * 4;
  uint8_t* o = reinterpret_cast<uint8_t*>(out);
  T::template store<0>(o, out_stride);
  if constexpr (MT * NT > 1) T::template store<1>(o + ((1 / NT) * 16 * out_stride) + (1 % NT) * 64, out_stride);
  if constexpr (MT * NT > 2) T::template store<2>(o + ((2 / NT) * 16 * out_stride) + (2 % NT) * 64, out_stride);
  if constexpr (MT * NT > 3) T::template store<3>(o + ((3 / NT) * 16 * out_stride) + (3 % NT) * 64, out_stride);
}

// Walks rows [m0, m1) (already in tile form at `x`, row r at x + (r - m0) * a_stride) and panels
// [p0, p1): 32-row x 32-column blocks while at least 17 rows are left, else 16-row x 64-column
// blocks (one A tile against a whole panel: decode). `emit(rows_from, rows, col_from, cols, acc,
// acc_stride)` writes a finished block.
template <class T, bool Int8, class Emit>
void tile_walk(const uint8_t* x, int64_t a_stride, int64_t m0, int64_t m1, const uint8_t* W, int64_t panel_bytes,
               int64_t p0, int64_t p1, int64_t n, int64_t k_tiles, Emit&& emit) {
  alignas(64) int32_t acc[32 * 64];
  const int64_t c_end = p1 * 64 < n ? p1 * 64 : n;
  for (int64_t i = m0; i < m1;) {
    const int64_t left = m1 - i;
    const uint8_t* xa = x + (i - m0) * a_stride;
    if (left > kTileRows) {
      const int64_t rows = left < 32 ? left : 32;
      for (int64_t c = p0 * 64; c < c_end; c += 32) {
        const uint8_t* panel = W + (c / 64) * panel_bytes + (c % 64) * 4;
        const uint8_t* wb[2] = {panel, panel + 64};
        tile_block<T, 2, 2, Int8>(xa, a_stride, wb, k_tiles, acc);
        emit(i, rows, c, c_end - c < 32 ? c_end - c : 32, acc, 32);
      }
      i += rows;
    } else {
      for (int64_t c = p0 * 64; c < c_end; c += 64) {
        const uint8_t* panel = W + (c / 64) * panel_bytes;
        const uint8_t* wb[4] = {panel, panel + 64, panel + 128, panel + 192};
        tile_block<T, 1, 4, Int8>(xa, a_stride, wb, k_tiles, acc);
        emit(i, left, c, c_end - c < 64 ? c_end - c : 64, acc, 64);
      }
      i += left;
    }
  }
}

// Packed bf16 linear on tiles. `round_rows(a, m0, m1, out)` writes rows [m0, m1) of X as bf16
// with row stride a.kp (the backend's rounding: identical bits on every backend); rows up to the
// next multiple of 16 are zero-filled here so whole A tiles can be loaded.
template <class T, class RoundRows>
void tile_linear_bf16_block(const LinearBf16Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                            bool x_ready, RoundRows&& round_rows) {
  uint16_t* xb = static_cast<uint16_t*>(xbuf);
  const int64_t padded_rows = (m1 - m0 + kTileRows - 1) / kTileRows * kTileRows;
  if (!x_ready) {
    round_rows(a, m0, m1, xb);
    std::memset(xb + (m1 - m0) * a.kp, 0, static_cast<size_t>((padded_rows - (m1 - m0)) * a.kp * 2));
  }
  T::configure();
  tile_walk<T, false>(
      reinterpret_cast<const uint8_t*>(xb), a.kp * 2, m0, m1, reinterpret_cast<const uint8_t*>(a.W),
      a.kp * kLinearPanel * 2, p0, p1, a.n, a.kp / kTileKBf16,
      [&](int64_t r0, int64_t rows, int64_t c0, int64_t cols, const int32_t* acc, int64_t stride) {
        for (int64_t r = 0; r < rows; ++r) {
          float* y = a.Y + (r0 + r) * a.ldy + c0;
          const int32_t* s = acc + r * stride;
          for (int64_t c = 0; c < cols; ++c) {
            float v;
            std::memcpy(&v, s + c, sizeof v);
            y[c] = a.bias ? v + a.bias[c0 + c] : v;
          }
        }
      });
  T::release();
}

// Int8 linear on tiles: a.xq holds the u8 activations (q + 128) of every row of the call padded
// to a multiple of 16 rows; the epilogue is reference/linear_int8.h's, element by element.
template <class T>
void tile_linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  T::configure();
  tile_walk<T, true>(a.xq + m0 * a.kp, a.kp, m0, m1, reinterpret_cast<const uint8_t*>(a.W), a.kp * kInt8Panel, p0, p1,
                     a.n, a.kp / kTileKInt8,
                     [&](int64_t r0, int64_t rows, int64_t c0, int64_t cols, const int32_t* acc, int64_t stride) {
                       for (int64_t r = 0; r < rows; ++r) {
                         float* y = a.Y + (r0 + r) * a.ldy + c0;
                         const float xs = a.xscale[r0 + r];
                         for (int64_t c = 0; c < cols; ++c) {
                           const int64_t j = c0 + c;
                           const int32_t dot = static_cast<int32_t>(
                               static_cast<uint32_t>(acc[r * stride + c]) - (static_cast<uint32_t>(a.row_sum[j]) << 7));
                           y[c] = std::fma(static_cast<float>(dot), xs * a.wscale[j], a.bias ? a.bias[j] : 0.0f);
                         }
                       }
                     });
  T::release();
}

// gemm_bf16 (gemm_paths.h, "bf16 GEMM") on tiles: the rows and panels of the vector kernel, packed
// by the vector traits V (gemm_bf16_tiles.h), padded with zeros to whole tiles (16 rows, 16
// k-pairs); a panel's 16 columns at c of 16 k-pairs are one B tile (stride 256 bytes, as above).
// Per 16-row x 64-column block the four C tiles are zeroed (first k-block) or loaded from the
// carry, run over the k-block's k tiles in order and stored back to the carry, which the last
// k-block writes to C. Each element's sum runs over the k tiles in order from zero whatever M, so
// rows are batch invariant.
template <class T, class V>
void tile_gemm_bf16_block(const GemmBf16Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch) {
  const int64_t stride = gemm_bf16_tile_row_stride(g.kp), pairs_k = g.kp / 2;
  const int64_t kblocks = (pairs_k + kBf16KPairs - 1) / kBf16KPairs;
  const int64_t rows = m1 - m0, padded_rows = (rows + kTileRows - 1) / kTileRows * kTileRows;
  uint32_t* arows = static_cast<uint32_t*>(scratch);
  uint32_t* panel = reinterpret_cast<uint32_t*>(static_cast<char*>(scratch) + gemm_bf16_tile_rows_bytes(g.kp));
  float* carry = reinterpret_cast<float*>(panel + kBf16KPairs * kBf16Panel);
  constexpr int64_t kCarryStride = kBf16Panel * 4;  // bytes per carried row
  T::configure();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const int64_t p0 = kb * kBf16KPairs, pairs = pairs_k - p0 < kBf16KPairs ? pairs_k - p0 : kBf16KPairs;
    const int64_t ktiles = (pairs + 15) / 16, tp = ktiles * 16;
    bf16_pack_rows<V>(g, m0, m1, p0, pairs, arows, stride);
    for (int64_t r = 0; r < rows; ++r) std::memset(arows + r * stride + pairs, 0, static_cast<size_t>(tp - pairs) * 4);
    for (int64_t r = rows; r < padded_rows; ++r) std::memset(arows + r * stride, 0, static_cast<size_t>(tp) * 4);
    // The loads below are asm without memory operands: the rows just written must be visible.
    __asm__ volatile("" ::: "memory");
    for (int64_t j0 = n0; j0 < n1; j0 += kBf16Panel) {
      const int64_t cols = n1 - j0 < kBf16Panel ? n1 - j0 : kBf16Panel;
      float* panel_carry = carry + ((j0 - n0) / kBf16Panel) * kGemmRowBlock * kBf16Panel;
      bf16_pack_panel<V>(g, j0, cols, p0, pairs, panel);
      for (int64_t p = pairs; p < tp; ++p) std::memset(panel + p * kBf16Panel, 0, kBf16Panel * 4);
      __asm__ volatile("" ::: "memory");
      for (int64_t i = 0; i < rows; i += kTileRows) {
        uint8_t* c = reinterpret_cast<uint8_t*>(panel_carry + i * kBf16Panel);
        if (kb == 0) {
          T::template zero<0>();
          T::template zero<1>();
          T::template zero<2>();
          T::template zero<3>();
        } else {
          T::template load<0>(c, kCarryStride);
          T::template load<1>(c + 64, kCarryStride);
          T::template load<2>(c + 128, kCarryStride);
          T::template load<3>(c + 192, kCarryStride);
        }
        for (int64_t kt = 0; kt < ktiles; ++kt) {
          const uint8_t* b = reinterpret_cast<const uint8_t*>(panel + kt * 16 * kBf16Panel);
          T::template load<4>(arows + i * stride + kt * 16, stride * 4);
          T::template load<6>(b, kPanelRowBytes);
          T::template dp_bf16<0, 4, 6>();
          T::template load<7>(b + 64, kPanelRowBytes);
          T::template dp_bf16<1, 4, 7>();
          T::template load<6>(b + 128, kPanelRowBytes);
          T::template dp_bf16<2, 4, 6>();
          T::template load<7>(b + 192, kPanelRowBytes);
          T::template dp_bf16<3, 4, 7>();
        }
        T::template store<0>(c, kCarryStride);
        T::template store<1>(c + 64, kCarryStride);
        T::template store<2>(c + 128, kCarryStride);
        T::template store<3>(c + 192, kCarryStride);
        if (kb + 1 < kblocks) continue;
        __asm__ volatile("" ::: "memory");
        const float* acc = panel_carry + i * kBf16Panel;
        for (int64_t r = 0; r < kTileRows && i + r < rows; ++r) {
          float* out = g.C + (m0 + i + r) * g.ldc + j0;
          const float* s = acc + r * kBf16Panel;
          for (int64_t j = 0; j < cols; ++j) out[j] = g.accumulate ? out[j] + s[j] : s[j];
        }
      }
    }
  }
  T::release();
}

}  // namespace
}  // namespace corelm::kernels
