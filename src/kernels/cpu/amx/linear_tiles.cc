// The AMX backend of amx_tile_kernels.h: the tile machine is the real one (tdpbf16ps, tdpbusd).
// Only run on CPUs where detected_isa() is Amx, which includes the kernel's grant of the tile
// state to this process (isa.cc).
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/amx_tile_kernels.h"
#include "kernels/cpu/avx512_bf16/gemm_bf16_vec.h"

namespace corelm::kernels::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig every_tile_16x64() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = kTileBytes;
    c.rows[t] = kTileRows;
  }
  return c;
}

// The intrinsics name tiles by literal register numbers, so each id is spelled out once here.
#define CORELM_TILE_CASES(op) \
  op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7)

struct HardwareTiles {
  static void configure() {
    static const TileConfig config = every_tile_16x64();
    // The tile loads are asm statements without a memory operand: make the activation rows the
    // caller just wrote visible to them.
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&config);
  }
  static void release() { _tile_release(); }
  template <int t>
  static void zero() {
#define CORELM_TILE_ZERO(i) if constexpr (t == i) _tile_zero(i);
    CORELM_TILE_CASES(CORELM_TILE_ZERO)
#undef CORELM_TILE_ZERO
  }
  template <int t>
  static void load(const void* p, int64_t stride) {
#define CORELM_TILE_LOAD(i) if constexpr (t == i) _tile_loadd(i, p, stride);
    CORELM_TILE_CASES(CORELM_TILE_LOAD)
#undef CORELM_TILE_LOAD
  }
  template <int t>
  static void store(void* p, int64_t stride) {
#define CORELM_TILE_STORE(i) if constexpr (t == i) _tile_stored(i, p, stride);
    CORELM_TILE_CASES(CORELM_TILE_STORE)
#undef CORELM_TILE_STORE
  }
  // Accumulators are tiles 0-3, A tiles 4-5, B tiles 6-7 (amx_tile_kernels.h).
  template <int c, int a, int b>
  static void dp_bf16() {
    static_assert(c >= 0 && c <= 3 && (a == 4 || a == 5) && (b == 6 || b == 7));
#define CORELM_DP(ci, ai, bi) if constexpr (c == ci && a == ai && b == bi) _tile_dpbf16ps(ci, ai, bi);
#define CORELM_DP_C(ci) CORELM_DP(ci, 4, 6) CORELM_DP(ci, 4, 7) CORELM_DP(ci, 5, 6) CORELM_DP(ci, 5, 7)
    CORELM_DP_C(0) CORELM_DP_C(1) CORELM_DP_C(2) CORELM_DP_C(3)
#undef CORELM_DP
  }
  template <int c, int a, int b>
  static void dp_u8s8() {
    static_assert(c >= 0 && c <= 3 && (a == 4 || a == 5) && (b == 6 || b == 7));
#define CORELM_DP(ci, ai, bi) if constexpr (c == ci && a == ai && b == bi) _tile_dpbusd(ci, ai, bi);
    CORELM_DP_C(0) CORELM_DP_C(1) CORELM_DP_C(2) CORELM_DP_C(3)
#undef CORELM_DP
#undef CORELM_DP_C
  }
};

#undef CORELM_TILE_CASES

}  // namespace

void linear_bf16_block(const LinearBf16Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready) {
  tile_linear_bf16_block<HardwareTiles>(a, m0, m1, p0, p1, xbuf, x_ready, avx512_bf16::round_rows_bf16);
}

void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  tile_linear_int8_block<HardwareTiles>(a, m0, m1, p0, p1);
}

void gemm_bf16_block(const GemmBf16Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch, bool) {
  tile_gemm_bf16_block<HardwareTiles, avx512_bf16::Dp16>(g, m0, m1, n0, n1, scratch);
}

}  // namespace corelm::kernels::amx

namespace corelm::kernels::amx {

// Peak probes for `corelm bench gemm`: four independent accumulator tiles, operands loaded once.
float tile_peak_loop(int64_t iters, bool int8) {
  alignas(64) static const uint8_t operand[kTileRows * kTileBytes] = {};
  alignas(64) float out[kTileRows * 16];
  HardwareTiles::configure();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, kTileBytes);
  _tile_loadd(5, operand, kTileBytes);
  _tile_loadd(6, operand, kTileBytes);
  _tile_loadd(7, operand, kTileBytes);
  for (int64_t i = 0; i < iters; ++i) {
    if (int8) {
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 64);
  HardwareTiles::release();
  return out[0];
}

}  // namespace corelm::kernels::amx
