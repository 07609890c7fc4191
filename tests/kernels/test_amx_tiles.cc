// The AMX tile kernels (amx_tile_kernels.h) under the packed-linear contracts. On every machine
// they run on the emulated tile machine (tile_emulation.cc), which checks the kernels' blocking,
// panel offsets, K/row padding and epilogues; on a CPU with AMX the hardware kernels also run
// through the LinearBf16 / LinearInt8 suites (EveryIsa/amx) and are compared with the emulation.
#include <cmath>
#include <cstring>
#include <limits>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/tile_emulation.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

using kernels::linear_bf16_tile_emulation;
using kernels::linear_int8_tile_emulation;
using kernels::pack_linear_bf16_any_cpu;
using kernels::pack_linear_int8_any_cpu;

bool cpu_has_amx() { return detected_isa() == Isa::Amx; }

// Emulated bf16 tiles against an fp64 product of the bf16-rounded operands; columns beyond n of
// each output row must stay untouched.
void check_bf16(int64_t m, int64_t n, int64_t k, bool with_bias, int64_t pad, uint64_t seed) {
  const int64_t ldw = k + pad, ldx = k + pad, ldy = n + pad;
  const auto W = random_floats(n * ldw, seed), X = random_floats(m * ldx, seed + 1);
  const auto bias = random_floats(n, seed + 2);
  auto Y = random_floats(m * ldy, seed + 3);
  const auto Y0 = Y;
  const auto packed = pack_linear_bf16_any_cpu(W.data(), n, k, ldw, with_bias ? bias.data() : nullptr, Isa::Amx);
  ASSERT_EQ(packed.k_padded % 32, 0);
  linear_bf16_tile_emulation(X.data(), m, ldx, packed, Y.data(), ldy);
  expect_rounded_product(X.data(), ldx, W.data(), ldw, with_bias ? bias.data() : nullptr, Y.data(), Y0.data(), ldy, m,
                         n, k);
}

TEST(AmxTilesEmulated, Bf16MatchesFp64OfRoundedOperands) {
  // Shapes straddle the tile edges: 16/32 rows, 16/32/64 columns, 32 k values per tile.
  const int64_t ns[] = {1, 15, 16, 17, 33, 64, 65, 130};
  const int64_t ks[] = {1, 2, 31, 32, 33, 64, 100};
  const int64_t ms[] = {1, 3, 15, 16, 17, 31, 32, 33, 40};
  uint64_t seed = 1;
  for (int64_t n : ns)
    for (int64_t k : ks) {
      check_bf16(ms[seed % 9], n, k, seed % 2 == 0, seed % 3 == 0 ? 3 : 0, seed);
      if (HasFatalFailure()) return;
      ++seed;
    }
}

TEST(AmxTilesEmulated, Bf16ManyRowAndColumnBlocks) {
  check_bf16(400, 300, 70, true, 0, 11);  // > one 384-row task, > one 256-column task
  check_bf16(1, 700, 257, false, 1, 12);  // decode: one row against many panels
}

TEST(AmxTilesEmulated, Bf16RowsAreBatchAndThreadInvariant) {
  const int64_t m = 37, n = 200, k = 75, big = 50;
  const auto W = random_floats(n * k, 21), X = random_floats(big * k, 22), bias = random_floats(n, 23);
  const auto packed = pack_linear_bf16_any_cpu(W.data(), n, k, k, bias.data(), Isa::Amx);
  expect_rows_batch_and_thread_invariant(X, big, m, k, n, [&](const float* x, int64_t rows, float* y) {
    linear_bf16_tile_emulation(x, rows, k, packed, y, n);
  });
}

TEST(AmxTilesEmulated, Bf16KeepsTheTwoChainsOfOneInstructionApart) {
  // One 32-value tile: the even products (x_0 w_0 = 1, then 2^-24 ...) and the odd ones (tiny)
  // are summed in separate fp32 chains and added at the end, so the small odd terms survive
  // together (16 x 2^-25 = 2^-21 is representable next to 1) where one sequential chain
  // starting from 1 would round each 2^-25 away.
  const int64_t n = 1, k = 32;
  std::vector<float> W(k, 1.0f), X(k, 0.0f);
  X[0] = 1.0f;
  for (int64_t t = 1; t < k; t += 2) X[t] = std::ldexp(1.0f, -25);
  const auto packed = pack_linear_bf16_any_cpu(W.data(), n, k, k, nullptr, Isa::Amx);
  float y = 0;
  linear_bf16_tile_emulation(X.data(), 1, k, packed, &y, n);
  EXPECT_EQ(y, 1.0f + std::ldexp(1.0f, -21));
}

TEST(AmxTilesEmulated, Int8EqualsTheReferenceBitwise) {
  const int64_t ms[] = {1, 2, 15, 16, 17, 33, 41, 400};
  uint64_t seed = 100;
  for (int64_t n : {1, 15, 64, 65, 200, 513})
    for (int64_t k : {1, 3, 63, 64, 65, 130}) {
      const int64_t m = ms[seed % 8];
      const auto W = random_floats(n * k, seed, 0.05f);
      auto X = random_floats(m * k, seed + 1, 3.0f);
      if (m > 2) {
        std::fill(X.begin() + k, X.begin() + 2 * k, 0.0f);                 // a zero row
        X[2 * k] = std::numeric_limits<float>::infinity();                  // a non-finite row
      }
      const auto bias = random_floats(n, seed + 2);
      const float* b = seed % 2 ? bias.data() : nullptr;
      const auto ref = kernels::pack_linear_int8(W.data(), n, k, k, b, Isa::Reference);
      const auto tiles = pack_linear_int8_any_cpu(W.data(), n, k, k, b, Isa::Amx);
      ASSERT_EQ(tiles.k_padded % 64, 0);
      ASSERT_EQ(ref.row_sum, tiles.row_sum);
      std::vector<float> want(m * n), got(m * n);
      kernels::linear_int8(X.data(), m, k, ref, want.data(), n);
      linear_int8_tile_emulation(X.data(), m, k, tiles, got.data(), n);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "m=" << m << " n=" << n << " k=" << k;
      ++seed;
    }
}

TEST(AmxTilesEmulated, MismatchedPackingIsAnError) {
  const int64_t n = 10, k = 6;
  const auto W = random_floats(n * k, 3);
  std::vector<float> X(k), Y(n);
  const auto ref = pack_linear_bf16_any_cpu(W.data(), n, k, k, nullptr, Isa::Reference);
  EXPECT_THROW(linear_bf16_tile_emulation(X.data(), 1, k, ref, Y.data(), n), ValueError);
  auto pairs = pack_linear_bf16_any_cpu(W.data(), n, k, k, nullptr, Isa::Avx512);
  pairs.isa = Isa::Amx;  // the vector layout pads k to 2, the tile layout to 32
  EXPECT_THROW(linear_bf16_tile_emulation(X.data(), 1, k, pairs, Y.data(), n), ValueError);
  auto quads = pack_linear_int8_any_cpu(W.data(), n, k, k, nullptr, Isa::Avx512Bf16);
  quads.isa = Isa::Amx;
  EXPECT_THROW(linear_int8_tile_emulation(X.data(), 1, k, quads, Y.data(), n), ValueError);
  if (!cpu_has_amx()) {
    EXPECT_THROW(kernels::pack_linear_bf16(W.data(), n, k, k, nullptr, Isa::Amx), ValueError);
    EXPECT_THROW(kernels::pack_linear_int8(W.data(), n, k, k, nullptr, Isa::Amx), ValueError);
  }
}

TEST(AmxTilesHardware, MatchesTheEmulation) {
  if (!cpu_has_amx())
    GTEST_SKIP() << "this CPU has no AMX-BF16/INT8 (or Linux refused the tile state): the tile kernels ran on the "
                    "emulated tiles above only";
  const int64_t m = 45, n = 300, k = 200;
  const auto W = random_floats(n * k, 31), X = random_floats(m * k, 32), bias = random_floats(n, 33);
  std::vector<float> hw(m * n), emu(m * n);
  const auto bf = kernels::pack_linear_bf16(W.data(), n, k, k, bias.data(), Isa::Amx);
  kernels::linear_bf16(X.data(), m, k, bf, hw.data(), n);
  linear_bf16_tile_emulation(X.data(), m, k, bf, emu.data(), n);
  int64_t same = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_NEAR(hw[i], emu[i], 1e-5 * (std::fabs(emu[i]) + 1)) << i;
    same += std::memcmp(&hw[i], &emu[i], 4) == 0;
  }
  // Whether the SDM's description of the rounding matches the silicon bit for bit is recorded,
  // not asserted: the contract is the tolerance above and batch invariance.
  RecordProperty("bf16_bitwise_equal_fraction", std::to_string(double(same) / double(m * n)));
  const auto i8 = kernels::pack_linear_int8(W.data(), n, k, k, bias.data(), Isa::Amx);
  kernels::linear_int8(X.data(), m, k, i8, hw.data(), n);
  linear_int8_tile_emulation(X.data(), m, k, i8, emu.data(), n);
  EXPECT_EQ(std::memcmp(hw.data(), emu.data(), hw.size() * 4), 0) << "integer tiles are exact";
}

}  // namespace
}  // namespace corelm::testing
