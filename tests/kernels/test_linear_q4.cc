// 4-bit linear: the fast kernels against the scalar reference (bitwise), every path against an fp64
// product of the dequantised weights within the bound activation quantization allows, the packing
// against the weights within one quantization step, K padding, batch/thread invariance and errors.
#include <cmath>
#include <cstring>
#include <limits>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/linear_q4.h"
#include "kernels/cpu/reference/linear_q4.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

using kernels::linear_q4;
using kernels::pack_linear_q4;
using kernels::PackedLinearQ4;
using kernels::Q4Format;
using kernels::kQ4Block;

bool has_vnni() { return static_cast<int>(detected_isa()) >= static_cast<int>(Isa::Avx512Bf16); }

// The weight W[j, t] the packing represents, read back through the layout helpers.
double dequantized(const PackedLinearQ4& p, int64_t j, int64_t t) {
  const int code = (p.codes[kernels::q4_code_index(p.k_padded, j, t)] >> kernels::q4_code_shift(t)) & 0x0f;
  const int64_t s = kernels::q4_scale_index(p.k_padded, j, t / kQ4Block);
  const double d = kernels::reference::fp16_value(p.scale[s]);
  if (p.format == Q4Format::Symmetric) return d * (code - 8);
  return d * code + kernels::reference::fp16_value(p.min[s]);
}

class LinearQ4 : public ::testing::TestWithParam<std::tuple<Isa, Q4Format>> {
 protected:
  ScopedIsa isa_{std::get<0>(GetParam())};
  Q4Format format() const { return std::get<1>(GetParam()); }
};

// Against W' (the dequantised weights) only the activations are rounded: in block b of row i each
// x moves by at most s_b / 2 (s_b = max|x in b| / 127), so |Y - x.W' - bias| <= sum_b s_b / 2 *
// sum_{t in b} |W'_t|, plus fp32 slack for the per-block products and sums. W' itself must be
// within one step (d, plus the fp16 rounding of the minimum) of W.
void check_against_dequantized(int64_t m, int64_t n, int64_t k, bool with_bias, int64_t pad, uint64_t seed,
                               Q4Format format) {
  const int64_t ldw = k + pad, ldx = k + pad, ldy = n + pad;
  const auto W = random_floats(n * ldw, seed, 0.1f), X = random_floats(m * ldx, seed + 1);
  const auto bias = random_floats(n, seed + 2);
  auto Y = random_floats(m * ldy, seed + 3);
  const auto Y0 = Y;
  const auto packed = pack_linear_q4(W.data(), n, k, ldw, with_bias ? bias.data() : nullptr, format);
  const Isa expected = active_isa() >= Isa::Avx512Bf16 ? Isa::Avx512Bf16
                       : active_isa() >= Isa::Avx2     ? Isa::Avx2
                                                       : Isa::Reference;
  ASSERT_EQ(packed.isa, expected);
  ASSERT_EQ(packed.k_padded % kQ4Block, 0);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t b = 0; b * kQ4Block < k; ++b) {
      double lo = 1e30, hi = -1e30;
      for (int64_t t = b * kQ4Block; t < std::min(k, (b + 1) * kQ4Block); ++t)
        lo = std::min(lo, double(W[j * ldw + t])), hi = std::max(hi, double(W[j * ldw + t]));
      const double step = format == Q4Format::Symmetric ? std::max(-lo, hi) / 8 : (hi - lo) / 15;
      for (int64_t t = b * kQ4Block; t < std::min(k, (b + 1) * kQ4Block); ++t)
        ASSERT_LE(std::fabs(dequantized(packed, j, t) - W[j * ldw + t]), step * 1.01 + 1e-3 * std::fabs(lo))
            << "W[" << j << "," << t << "] n=" << n << " k=" << k;
    }
  linear_q4(X.data(), m, ldx, packed, Y.data(), ldy);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldy; ++j) {
      if (j >= n) {
        ASSERT_EQ(std::memcmp(&Y[i * ldy + j], &Y0[i * ldy + j], 4), 0) << "padding column written";
        continue;
      }
      double dot = with_bias ? bias[j] : 0.0, bound = 1e-6, mag = std::fabs(dot);
      for (int64_t b = 0; b * kQ4Block < k; ++b) {
        double amax = 0, sum_w = 0;
        for (int64_t t = b * kQ4Block; t < std::min(k, (b + 1) * kQ4Block); ++t) {
          const double x = X[i * ldx + t], w = dequantized(packed, j, t);
          dot += x * w;
          mag += std::fabs(x * w);
          amax = std::max(amax, std::fabs(x));
          sum_w += std::fabs(w);
        }
        bound += amax / 127 / 2 * sum_w;
      }
      bound += 1e-5 * mag;
      ASSERT_NEAR(Y[i * ldy + j], dot, bound) << "Y[" << i << "," << j << "] m=" << m << " n=" << n << " k=" << k;
    }
}

TEST_P(LinearQ4, MatchesDequantizedFp32WithinActivationBound) {
  const int64_t ns[] = {1, 2, 15, 16, 17, 33, 64, 65, 100};
  const int64_t ks[] = {1, 5, 31, 32, 33, 64, 100, 172, 257};
  const int64_t ms[] = {1, 2, 3, 4, 5, 7, 13};
  uint64_t seed = 1;
  for (int64_t n : ns)
    for (int64_t k : ks) {
      check_against_dequantized(ms[seed % 7], n, k, seed % 2 == 0, seed % 3 == 0 ? 3 : 0, seed, format());
      if (HasFatalFailure()) return;
      ++seed;
    }
}

TEST_P(LinearQ4, ManyRowsAndColumnBlocks) {
  check_against_dequantized(400, 300, 96, true, 0, 11, format());  // > one row block, > one column block
  check_against_dequantized(1, 1300, 257, false, 1, 12, format());  // decode: one row streaming many panels
}

TEST_P(LinearQ4, RowsAreBatchAndThreadInvariant) {
  const int64_t m = 37, n = 450, k = 131, big = 50;
  const auto W = random_floats(n * k, 21), X = random_floats(big * k, 22), bias = random_floats(n, 23);
  const auto packed = pack_linear_q4(W.data(), n, k, k, bias.data(), format());
  expect_rows_batch_and_thread_invariant(X, big, m, k, n, [&](const float* x, int64_t rows, float* y) {
    linear_q4(x, rows, k, packed, y, n);
  });
}

// K = 40 is padded to 64: the result must be bitwise that of the same weights and inputs with the
// 24 missing columns present as explicit zeros.
TEST_P(LinearQ4, PaddingKEqualsExplicitZeros) {
  const int64_t n = 21, k = 40, kz = 64, m = 3;
  const auto W = random_floats(n * k, 41), X = random_floats(m * k, 42);
  std::vector<float> Wz(n * kz, 0.0f), Xz(m * kz, 0.0f), Y(m * n), Yz(m * n);
  for (int64_t j = 0; j < n; ++j) std::memcpy(&Wz[j * kz], &W[j * k], k * 4);
  for (int64_t i = 0; i < m; ++i) std::memcpy(&Xz[i * kz], &X[i * k], k * 4);
  const auto packed = pack_linear_q4(W.data(), n, k, k, nullptr, format());
  const auto packed_z = pack_linear_q4(Wz.data(), n, kz, kz, nullptr, format());
  EXPECT_EQ(packed.k_padded, kz);
  linear_q4(X.data(), m, k, packed, Y.data(), n);
  linear_q4(Xz.data(), m, kz, packed_z, Yz.data(), n);
  EXPECT_EQ(std::memcmp(Y.data(), Yz.data(), Y.size() * 4), 0);
}

TEST_P(LinearQ4, ZeroAndNonFiniteRowsStayRowLocal) {
  const int64_t n = 20, k = 70;
  const auto W = random_floats(n * k, 31), bias = random_floats(n, 32);
  auto X = random_floats(3 * k, 33);
  for (int64_t t = 0; t < k; ++t) X[t] = 0.0f;                  // row 0: zeros -> bias
  X[2 * k + 65] = std::numeric_limits<float>::infinity();       // row 2: inf in the last block -> NaN row
  std::vector<float> Y(3 * n), alone(n);
  const auto packed = pack_linear_q4(W.data(), n, k, k, bias.data(), format());
  linear_q4(X.data(), 3, k, packed, Y.data(), n);
  linear_q4(X.data() + k, 1, k, packed, alone.data(), n);
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(Y[j], bias[j]);
    EXPECT_TRUE(std::isnan(Y[2 * n + j])) << j;
  }
  EXPECT_EQ(std::memcmp(alone.data(), &Y[n], n * 4), 0) << "a non-finite neighbour changed row 1";
}

TEST_P(LinearQ4, BadInputsAreErrors) {
  auto W = random_floats(8 * 40, 1);
  EXPECT_THROW(pack_linear_q4(W.data(), 0, 40, 40, nullptr, format()), ValueError);
  EXPECT_THROW(pack_linear_q4(W.data(), 8, 0, 40, nullptr, format()), ValueError);
  EXPECT_THROW(pack_linear_q4(W.data(), 8, 40, 39, nullptr, format()), ValueError);  // ldw < k
  EXPECT_THROW(pack_linear_q4(nullptr, 8, 40, 40, nullptr, format()), ValueError);
  const auto packed = pack_linear_q4(W.data(), 8, 40, 40, nullptr, format());
  std::vector<float> X(80), Y(16);
  EXPECT_THROW(linear_q4(X.data(), 2, 39, packed, Y.data(), 8), ValueError);   // ldx < k
  EXPECT_THROW(linear_q4(X.data(), 2, 40, packed, Y.data(), 7), ValueError);   // ldy < n
  EXPECT_THROW(linear_q4(X.data(), -1, 40, packed, Y.data(), 8), ValueError);  // m < 0
  EXPECT_THROW(linear_q4(nullptr, 1, 40, packed, Y.data(), 8), ValueError);
  EXPECT_THROW(linear_q4(X.data(), 1, 40, PackedLinearQ4{}, Y.data(), 8), ValueError);  // never packed
  auto truncated = packed;
  truncated.codes.resize(truncated.codes.size() / 2);
  EXPECT_THROW(linear_q4(X.data(), 1, 40, truncated, Y.data(), 8), ValueError);
  auto relabeled = packed;
  relabeled.format = format() == Q4Format::Symmetric ? Q4Format::WithMin : Q4Format::Symmetric;  // minima missing / extra
  EXPECT_THROW(linear_q4(X.data(), 1, 40, relabeled, Y.data(), 8), ValueError);
  W[3 * 40 + 35] = std::numeric_limits<float>::quiet_NaN();
  try {
    pack_linear_q4(W.data(), 8, 40, 40, nullptr, format());
    FAIL() << "a NaN weight was packed";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("row 3 (inputs 32..39)"), std::string::npos) << e.what();
  }
  W[3 * 40 + 35] = 1e6f;  // a block scale past fp16's 65504
  EXPECT_THROW(pack_linear_q4(W.data(), 8, 40, 40, nullptr, format()), ValueError);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Isa, Q4Format>>& info) {
  return std::string(isa_name(std::get<0>(info.param))) + "_" + kernels::q4_format_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, LinearQ4,
                         ::testing::Combine(::testing::ValuesIn(isa_paths()),
                                            ::testing::Values(Q4Format::Symmetric, Q4Format::WithMin)),
                         param_name);

// `run(X, m, packed, Y)` against the reference over shapes straddling every tile and panel edge,
// then at the extremes: every code 15 (or 0) against activations at +-127, the largest block sums a
// kernel forms (16 products of 15 * 127 in one s16 lane of the AVX2 kernel: 30,480 < 32,767).
template <class Run>
void expect_bitwise_reference(Q4Format format, Isa pack_for, Run&& run) {
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 16, 41};
  uint64_t seed = 100;
  for (int64_t n : {1, 7, 15, 16, 17, 64, 65, 200, 513})
    for (int64_t k : {1, 3, 31, 32, 33, 64, 130, 513}) {
      const int64_t m = ms[seed % 9];
      const auto W = random_floats(n * k, seed, 0.05f), X = random_floats(m * k, seed + 1, 3.0f);
      const auto bias = random_floats(n, seed + 2);
      const float* b = seed % 2 ? bias.data() : nullptr;
      const auto ref = pack_linear_q4(W.data(), n, k, k, b, format, Isa::Reference);
      const auto fast = pack_linear_q4(W.data(), n, k, k, b, format, pack_for);
      ASSERT_EQ(fast.isa, pack_for);
      ASSERT_EQ(ref.codes, fast.codes);  // one layout for every kernel
      std::vector<float> want(m * n), got(m * n);
      linear_q4(X.data(), m, k, ref, want.data(), n);
      run(X.data(), m, fast, got.data());
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "m=" << m << " n=" << n << " k=" << k;
      ++seed;
    }
  const int64_t m = 5, n = 40, k = 96;
  std::vector<float> W(n * k), X(m * k);
  for (size_t i = 0; i < W.size(); ++i) W[i] = (i * 7919 % 3) ? 1.0f : -1.0f;
  for (size_t i = 0; i < X.size(); ++i) X[i] = (i * 104729 % 5) < 2 ? -2.0f : 2.0f;
  for (int64_t t = 0; t < k; ++t) W[t] = t % 32 == 0 ? -1.0f : 1.0f, X[t] = 2.0f;  // row 0 x column 0
  const auto ref = pack_linear_q4(W.data(), n, k, k, nullptr, format, Isa::Reference);
  const auto fast = pack_linear_q4(W.data(), n, k, k, nullptr, format, pack_for);
  std::vector<float> want(m * n), got(m * n);
  linear_q4(X.data(), m, k, ref, want.data(), n);
  run(X.data(), m, fast, got.data());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "extreme values";
}

class LinearQ4Kernel : public ::testing::TestWithParam<std::tuple<Isa, Q4Format>> {};

TEST_P(LinearQ4Kernel, MatchesReferenceBitwise) {
  const auto [kernel, format] = GetParam();
  if (static_cast<int>(detected_isa()) < static_cast<int>(kernel)) GTEST_SKIP() << "this CPU lacks " << isa_name(kernel);
  expect_bitwise_reference(format, kernel, [](const float* X, int64_t m, const PackedLinearQ4& W, float* Y) {
    linear_q4(X, m, W.k, W, Y, W.n);
  });
}

// The VNNI kernel's loops and tile shapes on emulated 16-lane vectors: runs on every machine.
TEST(LinearQ4VnniEmulation, MatchesReferenceBitwise) {
  for (Q4Format format : {Q4Format::Symmetric, Q4Format::WithMin}) {
    expect_bitwise_reference(format, Isa::Reference, [](const float* X, int64_t m, const PackedLinearQ4& W, float* Y) {
      kernels::linear_q4_vnni_emulation(X, m, W.k, W, Y, W.n);
    });
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(FastKernels, LinearQ4Kernel,
                         ::testing::Combine(::testing::Values(Isa::Avx2, Isa::Avx512Bf16),
                                            ::testing::Values(Q4Format::Symmetric, Q4Format::WithMin)),
                         param_name);

TEST(LinearQ4Packing, KernelsWithoutAQ4PathAreRejected) {
  const auto W = random_floats(10 * 6, 3);
  EXPECT_THROW(pack_linear_q4(W.data(), 10, 6, 6, nullptr, Q4Format::Symmetric, Isa::Avx512), ValueError);
  EXPECT_THROW(pack_linear_q4(W.data(), 10, 6, 6, nullptr, Q4Format::Symmetric, Isa::Amx), ValueError);
  if (!has_vnni()) {
    EXPECT_THROW(pack_linear_q4(W.data(), 10, 6, 6, nullptr, Q4Format::Symmetric, Isa::Avx512Bf16), ValueError);
    auto relabeled = pack_linear_q4(W.data(), 10, 6, 6, nullptr, Q4Format::Symmetric, Isa::Reference);
    relabeled.isa = Isa::Avx512Bf16;
    std::vector<float> X(6), Y(10);
    EXPECT_THROW(linear_q4(X.data(), 1, 6, relabeled, Y.data(), 10), ValueError);
  }
}

// The symmetric rule's anchor: the block's largest |w| is code 0 (-8 steps) exactly.
TEST(LinearQ4Packing, SymmetricExtremeIsExact) {
  std::vector<float> W(32, 0.25f);
  W[7] = -4.0f;  // d = 0.5: every value is on the grid, so dequantisation is exact
  W[9] = 3.5f;
  const auto p = pack_linear_q4(W.data(), 1, 32, 32, nullptr, Q4Format::Symmetric, Isa::Reference);
  EXPECT_EQ(dequantized(p, 0, 7), -4.0);
  EXPECT_EQ(dequantized(p, 0, 9), 3.5);
  EXPECT_EQ(dequantized(p, 0, 0), 0.0);  // 0.25 / 0.5 = 0.5 rounds to even: 0
}

}  // namespace
}  // namespace corelm::testing
