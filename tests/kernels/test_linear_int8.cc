// Int8 linear: the VNNI kernel against the scalar reference (bitwise), both against an fp32 product
// within the bound the two quantization steps allow, batch/thread invariance and bad-input errors.
#include <cmath>
#include <cstring>
#include <limits>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

using kernels::linear_int8;
using kernels::pack_linear_int8;

bool has_vnni() { return static_cast<int>(detected_isa()) >= static_cast<int>(Isa::Avx512Bf16); }

class LinearInt8 : public ::testing::TestWithParam<Isa> {
 protected:
  ScopedIsa isa_{GetParam()};
};

double abs_max(const float* x, int64_t k) {
  double a = 0;
  for (int64_t t = 0; t < k; ++t) a = std::max(a, double(std::fabs(x[t])));
  return a;
}

// |x.w - Q(x).Q(w)| <= (s_x / 2) sum|w| + (s_w / 2) (sum|x| + k s_x / 2): each rounding moves a
// value by at most half its step. Plus fp32 slack for the dequantization.
void check_against_fp32(int64_t m, int64_t n, int64_t k, bool with_bias, int64_t pad, uint64_t seed) {
  const int64_t ldw = k + pad, ldx = k + pad, ldy = n + pad;
  const auto W = random_floats(n * ldw, seed, 0.1f), X = random_floats(m * ldx, seed + 1);
  const auto bias = random_floats(n, seed + 2);
  auto Y = random_floats(m * ldy, seed + 3);
  const auto Y0 = Y;
  const auto packed = pack_linear_int8(W.data(), n, k, ldw, with_bias ? bias.data() : nullptr);
  const Isa expected = active_isa() == Isa::Avx512 ? Isa::Avx2 : active_isa();  // AVX-512F uses the AVX2 kernel
  ASSERT_EQ(packed.isa, expected);
  linear_int8(X.data(), m, ldx, packed, Y.data(), ldy);
  for (int64_t i = 0; i < m; ++i) {
    const double sx = abs_max(&X[i * ldx], k) / 127;
    for (int64_t j = 0; j < ldy; ++j) {
      if (j >= n) {
        ASSERT_EQ(std::memcmp(&Y[i * ldy + j], &Y0[i * ldy + j], 4), 0) << "padding column written";
        continue;
      }
      const double sw = abs_max(&W[j * ldw], k) / 127;
      double dot = 0, sum_x = 0, sum_w = 0, mag = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double x = X[i * ldx + t], w = W[j * ldw + t];
        dot += x * w;
        sum_x += std::fabs(x);
        sum_w += std::fabs(w);
        mag += std::fabs(x * w);
      }
      if (with_bias) dot += bias[j];
      const double bound = sx / 2 * sum_w + sw / 2 * (sum_x + k * sx / 2) + 1e-5 * (mag + std::fabs(bias[j])) + 1e-6;
      ASSERT_NEAR(Y[i * ldy + j], dot, bound) << "Y[" << i << "," << j << "] m=" << m << " n=" << n << " k=" << k;
    }
  }
}

TEST_P(LinearInt8, MatchesFp32WithinQuantizationBound) {
  const int64_t sizes[] = {1, 2, 3, 5, 15, 16, 17, 33, 64, 65, 100, 257};
  const int64_t ms[] = {1, 2, 3, 4, 6, 7, 13, 37};
  uint64_t seed = 1;
  for (int64_t n : sizes)
    for (int64_t k : sizes) {
      check_against_fp32(ms[seed % 8], n, k, seed % 2 == 0, seed % 3 == 0 ? 3 : 0, seed);
      if (HasFatalFailure()) return;
      ++seed;
    }
}

TEST_P(LinearInt8, ManyRowsAndColumnBlocks) {
  check_against_fp32(400, 700, 96, true, 0, 11);   // > one row block, > one column block
  check_against_fp32(1, 1300, 257, false, 1, 12);  // decode: one row streaming many panels
}

TEST_P(LinearInt8, RowsAreBatchAndThreadInvariant) {
  const int64_t m = 37, n = 450, k = 131, big = 50;
  const auto W = random_floats(n * k, 21), X = random_floats(big * k, 22), bias = random_floats(n, 23);
  const auto packed = pack_linear_int8(W.data(), n, k, k, bias.data());
  expect_rows_batch_and_thread_invariant(X, big, m, k, n, [&](const float* x, int64_t rows, float* y) {
    linear_int8(x, rows, k, packed, y, n);
  });
}

TEST_P(LinearInt8, QuantizesActivationsToNearestEven) {
  // max|x| = 127 gives a step of exactly 1, so 0.5, 1.5, 2.5 are ties: nearest-even makes them
  // 0, 2, 2 (round-half-away would give 1, 2, 3). One-hot weight rows read each value back.
  const int64_t n = 4, k = 4;
  const float W[] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  const float X[] = {127.0f, 0.5f, 1.5f, 2.5f};
  float Y[4];
  linear_int8(X, 1, k, pack_linear_int8(W, n, k, k, nullptr), Y, n);
  EXPECT_NEAR(Y[0], 127.0f, 1e-4);
  EXPECT_NEAR(Y[1], 0.0f, 1e-6);
  EXPECT_NEAR(Y[2], 2.0f, 1e-5);
  EXPECT_NEAR(Y[3], 2.0f, 1e-5);
}

TEST_P(LinearInt8, ZeroAndNonFiniteRowsStayRowLocal) {
  const int64_t n = 20, k = 18;
  const auto W = random_floats(n * k, 31), bias = random_floats(n, 32);
  auto X = random_floats(3 * k, 33);
  for (int64_t t = 0; t < k; ++t) X[t] = 0.0f;                      // row 0: zeros -> bias
  X[2 * k + 5] = std::numeric_limits<float>::infinity();           // row 2: inf -> NaN row
  std::vector<float> Y(3 * n), alone(n);
  const auto packed = pack_linear_int8(W.data(), n, k, k, bias.data());
  linear_int8(X.data(), 3, k, packed, Y.data(), n);
  linear_int8(X.data() + k, 1, k, packed, alone.data(), n);
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(Y[j], bias[j]);
    EXPECT_TRUE(std::isnan(Y[2 * n + j])) << j;
  }
  EXPECT_EQ(std::memcmp(alone.data(), &Y[n], n * 4), 0) << "a non-finite neighbour changed row 1";
}

TEST_P(LinearInt8, BadInputsAreErrors) {
  auto W = random_floats(8 * 5, 1);
  EXPECT_THROW(pack_linear_int8(W.data(), 0, 5, 5, nullptr), ValueError);
  EXPECT_THROW(pack_linear_int8(W.data(), 8, 0, 5, nullptr), ValueError);
  EXPECT_THROW(pack_linear_int8(W.data(), 8, 5, 4, nullptr), ValueError);  // ldw < k
  EXPECT_THROW(pack_linear_int8(nullptr, 8, 5, 5, nullptr), ValueError);
  EXPECT_THROW(pack_linear_int8(W.data(), 1, kernels::kMaxLinearInt8K + 1, kernels::kMaxLinearInt8K + 1, nullptr),
               ValueError);
  const auto packed = pack_linear_int8(W.data(), 8, 5, 5, nullptr);
  std::vector<float> X(10), Y(16);
  EXPECT_THROW(linear_int8(X.data(), 2, 4, packed, Y.data(), 8), ValueError);   // ldx < k
  EXPECT_THROW(linear_int8(X.data(), 2, 5, packed, Y.data(), 7), ValueError);   // ldy < n
  EXPECT_THROW(linear_int8(X.data(), -1, 5, packed, Y.data(), 8), ValueError);  // m < 0
  EXPECT_THROW(linear_int8(nullptr, 1, 5, packed, Y.data(), 8), ValueError);
  EXPECT_THROW(linear_int8(X.data(), 1, 5, kernels::PackedLinearI8{}, Y.data(), 8), ValueError);  // never packed
  auto truncated = packed;
  truncated.data.resize(truncated.data.size() / 2);
  EXPECT_THROW(linear_int8(X.data(), 1, 5, truncated, Y.data(), 8), ValueError);
  auto no_scales = packed;
  no_scales.scale.pop_back();
  EXPECT_THROW(linear_int8(X.data(), 1, 5, no_scales, Y.data(), 8), ValueError);
  W[13] = std::numeric_limits<float>::quiet_NaN();
  try {
    pack_linear_int8(W.data(), 8, 5, 5, nullptr);
    FAIL() << "a NaN weight was packed";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
  }
}

class LinearInt8Kernel : public ::testing::TestWithParam<Isa> {};

TEST_P(LinearInt8Kernel, MatchesReferenceBitwise) {
  const Isa kernel = GetParam();
  if (static_cast<int>(detected_isa()) < static_cast<int>(kernel)) GTEST_SKIP() << "this CPU lacks " << isa_name(kernel);
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 16, 41};
  uint64_t seed = 100;
  for (int64_t n : {1, 7, 15, 64, 65, 200, 513})
    for (int64_t k : {1, 3, 4, 7, 64, 130, 513}) {
      const int64_t m = ms[seed % 9];
      const auto W = random_floats(n * k, seed, 0.05f), X = random_floats(m * k, seed + 1, 3.0f);
      const auto bias = random_floats(n, seed + 2);
      const float* b = seed % 2 ? bias.data() : nullptr;
      const auto ref = pack_linear_int8(W.data(), n, k, k, b, Isa::Reference);
      const auto fast = pack_linear_int8(W.data(), n, k, k, b, kernel);
      ASSERT_EQ(fast.isa, kernel);
      ASSERT_EQ(ref.row_sum, fast.row_sum);
      ASSERT_EQ(ref.scale, fast.scale);
      std::vector<float> want(m * n), got(m * n);
      linear_int8(X.data(), m, k, ref, want.data(), n);
      linear_int8(X.data(), m, k, fast, got.data(), n);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "m=" << m << " n=" << n << " k=" << k;
      ++seed;
    }
  // Every value at +-max quantizes to +-127: the largest partial sums any kernel forms (2 * 127 *
  // 127 per pair: a saturating 16-bit pair sum of the u8 = q + 128 form would clip here).
  const int64_t m = 5, n = 70, k = 96;
  std::vector<float> W(n * k), X(m * k);
  for (size_t i = 0; i < W.size(); ++i) W[i] = (i * 7919 % 3) ? 1.0f : -1.0f;
  for (size_t i = 0; i < X.size(); ++i) X[i] = (i * 104729 % 5) < 2 ? -2.0f : 2.0f;
  for (int64_t j = 0; j < k; ++j) W[j] = 1.0f, X[j] = 2.0f;  // row 0 x column 0: every product +127 * 127
  const auto ref = pack_linear_int8(W.data(), n, k, k, nullptr, Isa::Reference);
  const auto fast = pack_linear_int8(W.data(), n, k, k, nullptr, kernel);
  std::vector<float> want(m * n), got(m * n);
  linear_int8(X.data(), m, k, ref, want.data(), n);
  linear_int8(X.data(), m, k, fast, got.data(), n);
  EXPECT_FLOAT_EQ(want[0], float(k) * 2.0f);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "extreme values";
}

TEST(LinearInt8Packing, MismatchedPackingIsAnError) {
  const int64_t n = 10, k = 6;  // k not a multiple of 4: the VNNI layout pads it
  const auto W = random_floats(n * k, 3);
  std::vector<float> X(k), Y(n);
  auto relabeled = pack_linear_int8(W.data(), n, k, k, nullptr, Isa::Reference);
  relabeled.isa = has_vnni() ? Isa::Avx512Bf16 : Isa::Amx;  // wrong layout / no int8 kernel
  EXPECT_THROW(linear_int8(X.data(), 1, k, relabeled, Y.data(), n), ValueError);
  EXPECT_THROW(pack_linear_int8(W.data(), n, k, k, nullptr, Isa::Avx512), ValueError);  // no int8 kernel of its own
}

INSTANTIATE_TEST_SUITE_P(FastKernels, LinearInt8Kernel, ::testing::Values(Isa::Avx2, Isa::Avx512Bf16, Isa::Amx),
                         isa_param_name);

INSTANTIATE_TEST_SUITE_P(EveryIsa, LinearInt8, ::testing::ValuesIn(isa_paths()), isa_param_name);

}  // namespace
}  // namespace corelm::testing
