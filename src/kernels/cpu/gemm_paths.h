// Internal interface between the GEMM dispatcher (gemm_dispatch.cc, baseline x86-64) and the
// per-ISA kernels (src/kernels/cpu/<isa>/, compiled with that ISA's -m flags).
//
// The ISA translation units only see plain structs and pointers: thread pool, scratch buffers and
// std containers stay in the baseline dispatcher, so no inline library code compiled with AVX-512
// flags can be picked by the linker for baseline callers.
//
// Work split (identical for every ISA and thread count): the output is cut into blocks of
// kGemmRowBlock rows x one column block; a block is one parallel_for task. Inside a block a kernel
// tiles freely, but every output element is one FMA chain over k = 0..K-1 in order, started from
// zero, then scaled by alpha and combined with beta * C. Nothing in that chain depends on M, on the
// row's position or on the thread count, which is what makes the kernels batch invariant.
#pragma once
#include <cstdint>

namespace corelm::kernels {

inline constexpr int64_t kGemmRowBlock = 384;  // rows per task (a multiple of every row tile)
inline constexpr int64_t kGemmColBlock = 256;  // columns per task (a multiple of every panel width)
inline constexpr int64_t kGemmKBlock = 128;    // k-steps per packed B panel (64 columns: 32 KiB, in L1)
inline constexpr int64_t kGemmMaxPanel = 64;   // widest fp32 panel (AVX-512: 4 zmm)
// Scratch of one fp32 GEMM task: a packed panel plus the accumulators carried between k-blocks.
inline constexpr int64_t kGemmF32ScratchFloats = (kGemmKBlock + kGemmRowBlock) * kGemmMaxPanel;

// The problem every GEMM path shares: C [M, N] from op(A) [M, K] and op(B) [K, N] (op: transposed
// when trans_*), row-major with leading dimensions lda, ldb, ldc.
struct GemmOperands {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int64_t lda = 0;
  const float* B = nullptr;
  int64_t ldb = 0;
  float* C = nullptr;
  int64_t ldc = 0;
};

struct GemmF32Args : GemmOperands {
  float alpha = 1.0f, beta = 0.0f;
};

// Computes C rows [m0, m1) x columns [n0, n1) (n1 - n0 <= kGemmColBlock, m1 - m0 <=
// kGemmRowBlock). `pack` is scratch of kGemmF32ScratchFloats floats, 64-byte aligned.
using GemmF32BlockFn = void (*)(const GemmF32Args&, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* pack);

// bf16 packed linear layout shared by the Avx2, Avx512 and Avx512Bf16 paths: W [N, K] is cut into
// panels of kLinearPanel output columns; within a panel, k-pairs are outermost and each column
// holds its two consecutive k values side by side (the operand order vdpbf16ps wants):
//   element (j, k) -> data[(j / 64) * (kp * 64) + (k / 2) * 128 + (j % 64) * 2 + k % 2]
// with kp = K rounded up to even. Padding rows/columns are zero.
inline constexpr int64_t kLinearPanel = 64;

struct LinearBf16Args {
  const float* X = nullptr;
  int64_t ldx = 0;
  const uint16_t* W = nullptr;  // packed as above
  const float* bias = nullptr;  // may be null
  int64_t n = 0, k = 0, kp = 0;
  float* Y = nullptr;
  int64_t ldy = 0;
};

// Computes Y rows [m0, m1) x panels [p0, p1). `xbuf` is scratch of at least
// linear_bf16_scratch_bytes(kp) bytes, 64-byte aligned (the rows of X rounded to bf16);
// `x_ready`: it already holds rows [m0, m1) of this call's X, rounded by the same kernel.
inline constexpr int64_t linear_bf16_scratch_bytes(int64_t kp) { return kGemmRowBlock * (kp + 16) * 4; }
using LinearBf16BlockFn = void (*)(const LinearBf16Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
                                   void* xbuf, bool x_ready);

// bf16 GEMM (gemm_bf16_tiles.h), the same task grid as gemm_f32. For each block of kBf16KPairs
// k-pairs a task rounds its rows of op(A) to bf16 (row-major, K zero-padded to kp = K rounded up
// to even, so consecutive (even, odd) values form the 32-bit pairs vdpbf16ps multiplies), then for
// each kBf16Panel-column panel packs op(B) rounded to bf16, pair-interleaved:
//   panel[p * kBf16Panel + j] = bf16(op(B)[2p, j]) | bf16(op(B)[2p + 1, j]) << 16
// Every C element is one dot-product chain over the pairs p = 0..kp/2-1 in order, started from
// zero (carried exactly between k-blocks), then written or added to C: batch invariant as above.
inline constexpr int64_t kBf16Panel = 64;    // columns per packed panel (4 zmm of pairs)
inline constexpr int64_t kBf16KPairs = 128;  // k-pairs per block (256 k: a 32 KiB panel, in L1)

struct GemmBf16Args : GemmOperands {
  int64_t kp = 0;           // K rounded up to even
  bool accumulate = false;  // C += product instead of C = product
};

// Pairs between consecutive rounded rows of op(A) (one k-block of them): long rows get 64 bytes
// of slack so that the MR rows a tile reads do not all map to the same L1 sets.
inline constexpr int64_t gemm_bf16_row_stride(int64_t kp) {
  return kp / 2 < kBf16KPairs ? (kp / 2 >= 64 ? kp / 2 + 16 : kp / 2) : kBf16KPairs + 16;
}
// Scratch of one task: the rounded rows (kGemmRowBlock rows of one k-block), then (64-byte
// aligned) the packed panel and the accumulators of every panel carried between k-blocks.
inline constexpr int64_t gemm_bf16_rows_bytes(int64_t kp) {
  return (kGemmRowBlock * gemm_bf16_row_stride(kp) * 4 + 63) / 64 * 64;
}
inline constexpr int64_t gemm_bf16_scratch_bytes(int64_t kp) {
  return gemm_bf16_rows_bytes(kp) + (kBf16KPairs * kBf16Panel + kGemmRowBlock * kGemmColBlock) * 4;
}
// The AMX tile GEMM (amx_tile_kernels.h) reads its rows 16 pairs (one A tile row) at a time, so its
// row stride holds whole tiles per k-block, plus the same slack.
inline constexpr int64_t gemm_bf16_tile_row_stride(int64_t kp) {
  return ((kp / 2 < kBf16KPairs ? kp / 2 : kBf16KPairs) + 15) / 16 * 16 + 16;
}
inline constexpr int64_t gemm_bf16_tile_rows_bytes(int64_t kp) {
  return (kGemmRowBlock * gemm_bf16_tile_row_stride(kp) * 4 + 63) / 64 * 64;
}
inline constexpr int64_t gemm_bf16_tile_scratch_bytes(int64_t kp) {
  return gemm_bf16_tile_rows_bytes(kp) + (kBf16KPairs * kBf16Panel + kGemmRowBlock * kGemmColBlock) * 4;
}
// Computes C rows [m0, m1) x columns [n0, n1) (block sizes as GemmF32BlockFn). `rows_ready`: the
// scratch already holds rows [m0, m1) of this call's op(A), rounded by the same kernel.
using GemmBf16BlockFn = void (*)(const GemmBf16Args&, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                                 void* scratch, bool rows_ready);

// Peak probes: `iters` rounds of 12 independent chains of one vector FMA (fp32) or vdpbf16ps
// each; the return value only keeps the work alive.
inline constexpr int kPeakChains = 12;

namespace avx2 {
float fma_peak_loop(int64_t iters);
void gemm_f32_block(const GemmF32Args&, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* pack);
void linear_bf16_block(const LinearBf16Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready);
}  // namespace avx2
namespace avx512 {
float fma_peak_loop(int64_t iters);
void gemm_f32_block(const GemmF32Args&, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* pack);
void linear_bf16_block(const LinearBf16Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready);
}  // namespace avx512
namespace avx512_bf16 {
float dpbf16_peak_loop(int64_t iters);
// Rows [m0, m1) of a.X as bf16 bit patterns (nearest-even, as bf16_bits()), zero-padded to a.kp:
// out[(i - m0) * a.kp + t]. Shared with the AMX kernel (every AMX CPU has AVX-512 BF16).
void round_rows_bf16(const LinearBf16Args& a, int64_t m0, int64_t m1, uint16_t* out);
void linear_bf16_block(const LinearBf16Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready);
void gemm_bf16_block(const GemmBf16Args&, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch,
                     bool rows_ready);
}  // namespace avx512_bf16

// AMX kernels (amx_tile_kernels.h): the packing is the panel layout above with kp padded to a
// multiple of kAmxKBf16; `xbuf` as for the other paths (rows are zero-padded to 16 inside).
inline constexpr int64_t kAmxKBf16 = 32;
namespace amx {
// `iters` rounds of 4 independent tdpbf16ps (int8: tdpbusd) on 16 x 64-byte tiles.
inline constexpr int kAmxPeakTiles = 4;
float tile_peak_loop(int64_t iters, bool int8);
// gemm_bf16 on tdpbf16ps (scratch: gemm_bf16_tile_scratch_bytes; rows_ready is ignored).
void gemm_bf16_block(const GemmBf16Args&, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch,
                     bool rows_ready);
void linear_bf16_block(const LinearBf16Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready);
}  // namespace amx
// The same loops on emulated tiles (tile_emulation.cc): any CPU, for tests.
namespace amx_emulated {
void linear_bf16_block(const LinearBf16Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready);
void gemm_bf16_block(const GemmBf16Args&, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch,
                     bool rows_ready);
}  // namespace amx_emulated

}  // namespace corelm::kernels
