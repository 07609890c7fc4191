// The emulated backend of amx_tile_kernels.h: eight 16 x 64-byte tiles in memory and the
// instructions as the Intel SDM describes them, in plain C++ (baseline x86-64, any CPU). It runs
// the AMX kernels' loops -- blocking, panel offsets, K and row padding, epilogues -- where no AMX
// hardware is available; on AMX machines the tests also compare it with the hardware.
//
// tdpbf16ps (SDM "Operation"): per output element, the even and the odd bf16 products of the 16
// k-pairs of one instruction are accumulated in two separate fp32 chains (FMA, round to nearest
// even, denormal inputs read as zero, denormal results flushed to zero), then the two chains are
// added and the sum is added to the accumulator. tdpbusd: exact u8 x s8 products summed into the
// int32 accumulator (wrapping).
#include <cmath>
#include <cstring>

#include "kernels/cpu/amx_tile_kernels.h"
#include "kernels/cpu/linear_bf16_tiles.h"

namespace corelm::kernels::amx_emulated {
namespace {

float flush_denormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

float bf16_value(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return flush_denormal(f);
}

struct EmulatedTiles {
  struct Registers {
    alignas(64) uint8_t tile[8][kTileRows * kTileBytes];
  };
  static Registers& regs() {
    thread_local Registers r;
    return r;
  }
  static uint8_t* tile(int t) { return regs().tile[t]; }

  static void configure() {}
  static void release() {}
  template <int t>
  static void zero() {
    std::memset(tile(t), 0, kTileRows * kTileBytes);
  }
  template <int t>
  static void load(const void* p, int64_t stride) {
    for (int64_t r = 0; r < kTileRows; ++r)
      std::memcpy(tile(t) + r * kTileBytes, static_cast<const uint8_t*>(p) + r * stride, kTileBytes);
  }
  template <int t>
  static void store(void* p, int64_t stride) {
    for (int64_t r = 0; r < kTileRows; ++r)
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, tile(t) + r * kTileBytes, kTileBytes);
  }
  template <int c, int a, int b>
  static void dp_bf16() {
    uint8_t *C = tile(c), *A = tile(a), *B = tile(b);
    for (int m = 0; m < kTileRows; ++m)
      for (int n = 0; n < 16; ++n) {
        float even = 0.0f, odd = 0.0f;
        for (int k = 0; k < 16; ++k) {
          const uint8_t* ap = A + m * kTileBytes + k * 4;
          const uint8_t* bp = B + k * kTileBytes + n * 4;
          even = flush_denormal(std::fma(bf16_value(ap), bf16_value(bp), even));
          odd = flush_denormal(std::fma(bf16_value(ap + 2), bf16_value(bp + 2), odd));
        }
        float acc;
        std::memcpy(&acc, C + m * kTileBytes + n * 4, 4);
        acc = flush_denormal(acc + flush_denormal(even + odd));
        std::memcpy(C + m * kTileBytes + n * 4, &acc, 4);
      }
  }
  template <int c, int a, int b>
  static void dp_u8s8() {
    uint8_t *C = tile(c), *A = tile(a), *B = tile(b);
    for (int m = 0; m < kTileRows; ++m)
      for (int n = 0; n < 16; ++n) {
        uint32_t acc;
        std::memcpy(&acc, C + m * kTileBytes + n * 4, 4);
        for (int k = 0; k < 16; ++k)
          for (int i = 0; i < 4; ++i) {
            const int32_t x = A[m * kTileBytes + k * 4 + i];
            const int32_t w = static_cast<int8_t>(B[k * kTileBytes + n * 4 + i]);
            acc += static_cast<uint32_t>(x * w);
          }
        std::memcpy(C + m * kTileBytes + n * 4, &acc, 4);
      }
  }
};

// Packing traits of gemm_bf16_tiles.h in plain C++ (the same bits as the vector traits).
struct ScalarPairs {
  static constexpr int kWidth = 16;
  static void round_row(const float* x, int64_t n, uint16_t* out) {
    for (int64_t t = 0; t < n; ++t) out[t] = static_cast<uint16_t>(bf16_bits(x[t]));
  }
  static void round_pairs(const float* even, const float* odd, int64_t n, uint32_t* out) {
    for (int64_t q = 0; q < n; ++q) out[q] = bf16_bits(even[q]) | (odd ? bf16_bits(odd[q]) << 16 : 0u);
  }
  static void transpose_pairs(const uint32_t* src, int64_t ss, uint32_t* dst, int64_t ds) {
    for (int r = 0; r < kWidth; ++r)
      for (int c = 0; c < kWidth; ++c) dst[c * ds + r] = src[r * ss + c];
  }
};

void round_rows_scalar(const LinearBf16Args& a, int64_t m0, int64_t m1, uint16_t* out) {
  for (int64_t i = m0; i < m1; ++i) {
    uint16_t* o = out + (i - m0) * a.kp;
    for (int64_t t = 0; t < a.k; ++t) o[t] = static_cast<uint16_t>(bf16_bits(a.X[i * a.ldx + t]));
    for (int64_t t = a.k; t < a.kp; ++t) o[t] = 0;
  }
}

}  // namespace

void linear_bf16_block(const LinearBf16Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready) {
  tile_linear_bf16_block<EmulatedTiles>(a, m0, m1, p0, p1, xbuf, x_ready, round_rows_scalar);
}

void linear_int8_block(const LinearI8Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  tile_linear_int8_block<EmulatedTiles>(a, m0, m1, p0, p1);
}

void gemm_bf16_block(const GemmBf16Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch, bool) {
  tile_gemm_bf16_block<EmulatedTiles, ScalarPairs>(g, m0, m1, n0, n1, scratch);
}

}  // namespace corelm::kernels::amx_emulated
