// Packed bf16 linear on every ISA path against an fp64 product of the bf16-rounded operands,
// plus batch/thread invariance and bad-input errors.
#include <cmath>
#include <cstring>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

using kernels::linear_bf16;
using kernels::pack_linear_bf16;

class LinearBf16 : public ::testing::TestWithParam<Isa> {
 protected:
  ScopedIsa isa_{GetParam()};
};

void check_linear(int64_t m, int64_t n, int64_t k, bool with_bias, int64_t pad, uint64_t seed) {
  const int64_t ldw = k + pad, ldx = k + pad, ldy = n + pad;
  const auto W = random_floats(n * ldw, seed), X = random_floats(m * ldx, seed + 1);
  const auto bias = random_floats(n, seed + 2);
  auto Y = random_floats(m * ldy, seed + 3);
  const auto Y0 = Y;
  const auto packed = pack_linear_bf16(W.data(), n, k, ldw, with_bias ? bias.data() : nullptr);
  ASSERT_EQ(packed.isa, active_isa());
  linear_bf16(X.data(), m, ldx, packed, Y.data(), ldy);
  expect_rounded_product(X.data(), ldx, W.data(), ldw, with_bias ? bias.data() : nullptr, Y.data(), Y0.data(), ldy, m,
                         n, k);
}

TEST_P(LinearBf16, MatchesFp64OfRoundedOperands) {
  const int64_t sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 65, 100, 257};
  const int64_t ms[] = {1, 2, 3, 4, 6, 7, 13, 37};
  uint64_t seed = 1;
  for (int64_t n : sizes)
    for (int64_t k : sizes) {
      const int64_t m = ms[seed % 8];
      check_linear(m, n, k, seed % 2 == 0, seed % 3 == 0 ? 3 : 0, seed);
      if (HasFatalFailure()) return;
      ++seed;
    }
}

TEST_P(LinearBf16, ManyRowsAndColumnBlocks) {
  check_linear(400, 700, 96, true, 0, 11);   // > one row block, > one column block
  check_linear(1, 1300, 257, false, 1, 12);  // decode: one row streaming many panels
}

TEST_P(LinearBf16, RowsAreBatchAndThreadInvariant) {
  const int64_t m = 37, n = 450, k = 131, big = 50;
  const auto W = random_floats(n * k, 21), X = random_floats(big * k, 22), bias = random_floats(n, 23);
  const auto packed = pack_linear_bf16(W.data(), n, k, k, bias.data());
  expect_rows_batch_and_thread_invariant(X, big, m, k, n, [&](const float* x, int64_t rows, float* y) {
    linear_bf16(x, rows, k, packed, y, n);
  });
}

TEST_P(LinearBf16, RoundsInputsToNearestEven) {
  // x = 1 + 2^-8 lies exactly between two bf16 values: nearest-even rounds it down to 1, so a
  // weight of 1 must give exactly 1 (truncation or round-half-up would differ on other inputs).
  const int64_t n = 3, k = 2;
  const float W[] = {1, 0, 0, 1, 1, 1};
  const float X[] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256};  // ties: down to 1, up to 1 + 2^-6
  const auto packed = pack_linear_bf16(W, n, k, k, nullptr);
  float Y[3];
  linear_bf16(X, 1, k, packed, Y, n);
  EXPECT_EQ(Y[0], 1.0f);
  EXPECT_EQ(Y[1], 1.0f + 1.0f / 64);
  EXPECT_EQ(Y[2], 2.0f + 1.0f / 64);
}

TEST_P(LinearBf16, BadInputsAreErrors) {
  const auto W = random_floats(8 * 4, 1);
  EXPECT_THROW(pack_linear_bf16(W.data(), 0, 4, 4, nullptr), ValueError);
  EXPECT_THROW(pack_linear_bf16(W.data(), 8, 4, 3, nullptr), ValueError);
  const auto packed = pack_linear_bf16(W.data(), 8, 4, 4, nullptr);
  std::vector<float> X(8), Y(16);
  EXPECT_THROW(linear_bf16(X.data(), 2, 3, packed, Y.data(), 8), ValueError);   // ldx < k
  EXPECT_THROW(linear_bf16(X.data(), 2, 4, packed, Y.data(), 7), ValueError);   // ldy < n
  EXPECT_THROW(linear_bf16(X.data(), -1, 4, packed, Y.data(), 8), ValueError);  // m < 0
  auto broken = packed;
  broken.data.resize(broken.data.size() / 2);
  EXPECT_THROW(linear_bf16(X.data(), 1, 4, broken, Y.data(), 8), ValueError);  // truncated packing
}

TEST(LinearBf16Packing, ExplicitKernelChoice) {
  const int64_t n = 70, k = 40;
  const auto W = random_floats(n * k, 7), X = random_floats(5 * k, 8);
  std::vector<float> want(5 * n), got(5 * n);
  for (Isa kernel : supported_isas()) {
    const auto packed = pack_linear_bf16(W.data(), n, k, k, nullptr, kernel);
    EXPECT_EQ(packed.isa, kernel);
    {
      ScopedIsa isa(kernel);
      linear_bf16(X.data(), 5, k, pack_linear_bf16(W.data(), n, k, k, nullptr), want.data(), n);
    }
    linear_bf16(X.data(), 5, k, packed, got.data(), n);  // whatever path is active now
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << isa_name(kernel);
  }
  if (detected_isa() != Isa::Amx) {
    EXPECT_THROW(pack_linear_bf16(W.data(), n, k, k, nullptr, Isa::Amx), ValueError);
  }
}

TEST(LinearBf16Packing, RunsTheKernelItWasPackedFor) {
  // A weight packed under the reference path keeps the reference kernel when a faster path is
  // active, and gives exactly the reference result.
  const int64_t n = 20, k = 33;
  const auto W = random_floats(n * k, 5), X = random_floats(3 * k, 6);
  kernels::PackedLinear ref_packed;
  std::vector<float> want(3 * n), got(3 * n);
  {
    ScopedIsa isa(Isa::Reference);
    ref_packed = pack_linear_bf16(W.data(), n, k, k, nullptr);
    linear_bf16(X.data(), 3, k, ref_packed, want.data(), n);
  }
  linear_bf16(X.data(), 3, k, ref_packed, got.data(), n);
  EXPECT_EQ(ref_packed.isa, Isa::Reference);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, LinearBf16, ::testing::ValuesIn(isa_paths()), isa_param_name);

}  // namespace
}  // namespace corelm::testing
