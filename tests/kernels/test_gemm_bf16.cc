// gemm_bf16 on every ISA path: the scalar reference equals the fp64 product of the bf16-rounded
// operands (and gemm_f32 on rounded copies) within fp32 accumulation error, every path equals the
// reference within that error over edge shapes and all four transposes, rows are bitwise batch and
// thread invariant, and the bf16-kernel choice follows its rule and its override.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/reference/gemm_bf16.h"
#include "kernels/cpu/tile_emulation.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

using kernels::gemm_bf16;

struct Shape3 {
  bool ta, tb;
  int64_t M, N, K, pad;
};

struct Operands {
  std::vector<float> A, B;
  int64_t lda, ldb, ldc;
};

Operands make(const Shape3& s, uint64_t seed) {
  Operands o;
  const int64_t a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
  const int64_t b_rows = s.tb ? s.N : s.K, b_cols = s.tb ? s.K : s.N;
  o.lda = a_cols + s.pad;
  o.ldb = b_cols + s.pad;
  o.ldc = s.N + s.pad;
  o.A = random_floats(static_cast<size_t>(a_rows * o.lda), seed);
  o.B = random_floats(static_cast<size_t>(b_rows * o.ldb), seed + 1);
  return o;
}

// C against the fp64 product of the rounded operands: |C - exact| <= K * 2^-23 * sum |a b| (the
// bound of any order of fp32 additions), plus C0 when accumulating; padding columns untouched.
void expect_rounded_product(const Shape3& s, const Operands& o, const std::vector<float>& C,
                            const std::vector<float>& C0, bool accumulate) {
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < o.ldc; ++j) {
      const float got = C[i * o.ldc + j];
      if (j >= s.N) {
        ASSERT_EQ(std::memcmp(&got, &C0[i * o.ldc + j], 4), 0) << "padding column " << j << " written";
        continue;
      }
      double dot = 0, mag = 0;
      for (int64_t k = 0; k < s.K; ++k) {
        const double p =
            double(round_bf16(op_a(o.A.data(), o.lda, s.ta, i, k))) * round_bf16(op_b(o.B.data(), o.ldb, s.tb, k, j));
        dot += p;
        mag += std::fabs(p);
      }
      const double c0 = accumulate ? C0[i * o.ldc + j] : 0.0;
      const double tol = (s.K + 1) * std::ldexp(1.0, -23) * (mag + std::fabs(c0)) + 1e-30;
      ASSERT_NEAR(got, dot + c0, tol) << "C[" << i << "," << j << "] ta=" << s.ta << " tb=" << s.tb << " M=" << s.M
                                      << " N=" << s.N << " K=" << s.K;
    }
}

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                        int64_t, bool);

void check(const Shape3& s, uint64_t seed, bool accumulate = false, GemmFn fn = gemm_bf16) {
  const Operands o = make(s, seed);
  std::vector<float> C = random_floats(static_cast<size_t>(s.M * o.ldc), seed + 2);
  const std::vector<float> C0 = C;
  fn(s.ta, s.tb, s.M, s.N, s.K, o.A.data(), o.lda, o.B.data(), o.ldb, C.data(), o.ldc, accumulate);
  expect_rounded_product(s, o, C, C0, accumulate);
}

TEST(GemmBf16Reference, EqualsRoundedProductAndGemmF32OnRoundedCopies) {
  uint64_t seed = 1;
  for (int combo = 0; combo < 4; ++combo)
    for (int64_t M : {1, 5, 33})
      for (int64_t N : {1, 17, 70})
        for (int64_t K : {1, 2, 7, 130}) {
          const Shape3 s{bool(combo & 1), bool(combo & 2), M, N, K, 3};
          const Operands o = make(s, seed++);
          std::vector<float> C(static_cast<size_t>(M * o.ldc), 0.5f);
          const std::vector<float> C0 = C;
          kernels::reference::gemm_bf16(s.ta, s.tb, M, N, K, o.A.data(), o.lda, o.B.data(), o.ldb, C.data(), o.ldc,
                                        false);
          expect_rounded_product(s, o, C, C0, false);
          if (HasFatalFailure()) return;
          // gemm_f32 on the rounded values is the same contract (products of bf16 values are exact).
          std::vector<float> ra(o.A), rb(o.B), F(C0);
          for (float& x : ra) x = round_bf16(x);
          for (float& x : rb) x = round_bf16(x);
          kernels::gemm_f32(s.ta, s.tb, M, N, K, 1.0f, ra.data(), o.lda, rb.data(), o.ldb, 0.0f, F.data(), o.ldc);
          expect_rounded_product(s, o, F, C0, false);
          if (HasFatalFailure()) return;
        }
}

class GemmBf16 : public ::testing::TestWithParam<Isa> {
 protected:
  ScopedIsa isa_{GetParam()};
};

TEST_P(GemmBf16, MatchesRoundedProductOverEdgeShapes) {
  uint64_t seed = 10;
  const int64_t sizes[] = {1, 2, 3, 6, 7, 15, 16, 17, 33, 64, 65, 100};
  for (int64_t M : sizes)
    for (int64_t N : sizes)
      for (int64_t K : {1, 2, 3, 17, 64, 257}) {
        const int combo = static_cast<int>(seed % 4);
        check({bool(combo & 1), bool(combo & 2), M, N, K, 0}, seed++);
        if (HasFatalFailure()) return;
      }
}

TEST_P(GemmBf16, AllTransposesWithStridesAndAccumulate) {
  uint64_t seed = 500;
  for (int combo = 0; combo < 4; ++combo)
    for (int64_t M : {1, 7, 65})
      for (int64_t N : {3, 16, 100})
        for (int64_t K : {5, 34, 300})
          for (bool acc : {false, true}) {
            check({bool(combo & 1), bool(combo & 2), M, N, K, 5}, seed++, acc);
            if (HasFatalFailure()) return;
          }
}

TEST_P(GemmBf16, LargeBlocksAcrossTaskAndKBlockBoundaries) {
  check({false, true, 400, 530, 300, 0}, 7);       // past 384 rows / 256 columns
  check({true, false, 97, 257, 1030, 3}, 8, true);  // K over several 256-k blocks
  check({true, true, 390, 70, 513, 1}, 9);
}

TEST_P(GemmBf16, KZeroWritesZerosOrKeepsC) {
  std::vector<float> C(6 * 20, 2.0f);
  const float dummy = 0.0f;
  gemm_bf16(false, true, 6, 20, 0, &dummy, 1, &dummy, 1, C.data(), 20, true);
  for (float v : C) ASSERT_EQ(v, 2.0f);
  gemm_bf16(false, true, 6, 20, 0, &dummy, 1, &dummy, 1, C.data(), 20);
  for (float v : C) ASSERT_EQ(v, 0.0f);
}

TEST_P(GemmBf16, OverwritesNaNAndPropagatesNaNOperands) {
  const int64_t M = 9, N = 70, K = 20;
  auto A = random_floats(M * K, 1), B = random_floats(K * N, 2);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN());
  gemm_bf16(false, false, M, N, K, A.data(), K, B.data(), N, C.data(), N);
  for (float v : C) ASSERT_TRUE(std::isfinite(v));
  A[3 * K + 4] = std::numeric_limits<float>::quiet_NaN();
  gemm_bf16(false, false, M, N, K, A.data(), K, B.data(), N, C.data(), N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) ASSERT_EQ(std::isnan(C[i * N + j]), i == 3) << i << "," << j;
}

TEST_P(GemmBf16, NegativeSizeIsAnError) {
  float x = 0;
  EXPECT_THROW(gemm_bf16(false, false, 2, -1, 2, &x, 2, &x, 2, &x, 2), ValueError);
}

// Row i of a 37-row product, bitwise, equals the row computed alone, at another position among
// other rows, and with 2 threads instead of 1 -- for the three training products' transposes.
TEST_P(GemmBf16, RowsAreBatchAndThreadInvariant) {
  // M = 37, N = 300, K = 301, big = 400 (past one 384-row block), offset = 13
  expect_gemm_rows_batch_and_thread_invariant(
      37, 300, 301, 400, 13,
      [](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
         float* C) { gemm_bf16(ta, tb, m, n, k, A, lda, B, ldb, C, n); });
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, GemmBf16, ::testing::ValuesIn(isa_paths()), isa_param_name);

// The AMX tile GEMM's loops (packing into whole tiles, k-blocks carried through the C tiles, row
// and column edges, accumulate) on emulated tiles, on any CPU; on AMX CPUs AmxTileGemmHardware
// also checks the real tiles against the emulation, bit for bit.
TEST(GemmBf16TileEmulation, MatchesRoundedProduct) {
  uint64_t seed = 900;
  for (int combo = 0; combo < 4; ++combo)
    for (int64_t M : {1, 16, 17, 40})
      for (int64_t N : {1, 16, 70})
        for (int64_t K : {1, 31, 32, 33, 300}) {
          check({bool(combo & 1), bool(combo & 2), M, N, K, 3}, seed++, combo == 1, kernels::gemm_bf16_tile_emulation);
          if (HasFatalFailure()) return;
        }
  check({false, true, 390, 260, 40, 0}, 950, false, kernels::gemm_bf16_tile_emulation);  // past one task block
}

TEST(GemmBf16TileEmulation, RowsAreBatchInvariant) {
  const int64_t M = 20, N = 40, K = 290, big = 37, offset = 5;
  const auto A = random_floats(big * K, 61), B = random_floats(N * K, 62);
  std::vector<float> full(M * N), alone(N), shifted(big * N), rot(big * K);
  kernels::gemm_bf16_tile_emulation(false, true, M, N, K, A.data(), K, B.data(), K, full.data(), N);
  for (int64_t r = 0; r < big; ++r) std::memcpy(&rot[r * K], &A[((r - offset + big) % big) * K], K * 4);
  kernels::gemm_bf16_tile_emulation(false, true, big, N, K, rot.data(), K, B.data(), K, shifted.data(), N);
  for (int64_t i = 0; i < M; ++i) {
    kernels::gemm_bf16_tile_emulation(false, true, 1, N, K, A.data() + i * K, K, B.data(), K, alone.data(), N);
    ASSERT_EQ(std::memcmp(alone.data(), &full[i * N], N * 4), 0) << "row " << i << " alone differs";
    ASSERT_EQ(std::memcmp(&shifted[(i + offset) * N], &full[i * N], N * 4), 0) << "row " << i << " at offset differs";
  }
}

TEST(AmxTileGemmHardware, MatchesTheEmulation) {
  if (!kernels::bf16_gemm_supported(kernels::Bf16Gemm::Amx)) GTEST_SKIP() << "no AMX tiles on this CPU";
  for (int combo = 0; combo < 4; ++combo) {
    const Shape3 s{bool(combo & 1), bool(combo & 2), 50, 90, 301, 2};
    const Operands o = make(s, 70 + combo);
    std::vector<float> hw(s.M * o.ldc, 0.0f), emu(hw);
    gemm_bf16(kernels::Bf16Gemm::Amx, s.ta, s.tb, s.M, s.N, s.K, o.A.data(), o.lda, o.B.data(), o.ldb, hw.data(), o.ldc);
    kernels::gemm_bf16_tile_emulation(s.ta, s.tb, s.M, s.N, s.K, o.A.data(), o.lda, o.B.data(), o.ldb, emu.data(),
                                      o.ldc);
    expect_rounded_product(s, o, hw, std::vector<float>(hw.size(), 0.0f), false);
    EXPECT_EQ(std::memcmp(hw.data(), emu.data(), hw.size() * 4), 0) << "hardware tiles differ from the emulation";
  }
}

// The fast kernel against the reference directly, on the training shapes of a small model (the
// forward X.W^T, dX = dY.W, dW = dY^T.X).
TEST(GemmBf16Fast, TrainingShapesMatchReference) {
  if (static_cast<int>(detected_isa()) < static_cast<int>(Isa::Avx512Bf16)) GTEST_SKIP() << "no vdpbf16ps on this CPU";
  ScopedIsa isa(Isa::Avx512Bf16);
  const int64_t rows = 130, in = 96, out = 200;
  const auto X = random_floats(rows * in, 1), W = random_floats(out * in, 2), G = random_floats(rows * out, 3);
  struct P {
    bool ta, tb;
    int64_t M, N, K;
    const float* A;
    int64_t lda;
    const float* B;
    int64_t ldb;
  };
  const P products[] = {{false, true, rows, out, in, X.data(), in, W.data(), in},
                        {false, false, rows, in, out, G.data(), out, W.data(), in},
                        {true, false, out, in, rows, G.data(), out, X.data(), in}};
  for (const P& p : products) {
    std::vector<float> fast(p.M * p.N), ref(p.M * p.N);
    gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, p.A, p.lda, p.B, p.ldb, fast.data(), p.N);
    kernels::reference::gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, p.A, p.lda, p.B, p.ldb, ref.data(), p.N, false);
    double max_rel = 0;
    for (size_t i = 0; i < fast.size(); ++i)
      max_rel = std::max(max_rel, std::fabs(double(fast[i]) - ref[i]) / (std::fabs(double(ref[i])) + 1.0));
    EXPECT_LT(max_rel, 64 * p.K * std::ldexp(1.0, -24)) << "ta=" << p.ta << " tb=" << p.tb;
  }
}

TEST(Bf16GemmChoice, RuleNeedsAClearlyHigherBf16Peak) {
  using kernels::Bf16Gemm;
  using kernels::choose_bf16_gemm;
  EXPECT_EQ(choose_bf16_gemm({263, 485}), Bf16Gemm::Dpbf16);  // Zen5: full-rate vdpbf16ps
  EXPECT_EQ(choose_bf16_gemm({179, 86}), Bf16Gemm::Rounded);  // half-rate (Intel before AMX)
  EXPECT_EQ(choose_bf16_gemm({200, 250}), Bf16Gemm::Rounded);  // 1.25x: not worth a kernel change
  EXPECT_EQ(choose_bf16_gemm({200, 260}), Bf16Gemm::Dpbf16);
  EXPECT_EQ(choose_bf16_gemm({200, 0}), Bf16Gemm::Rounded);  // no vdpbf16ps
  // Tiles win when clearly above the better vector path (Sapphire Rapids-like: half-rate dpbf16).
  EXPECT_EQ(choose_bf16_gemm({179, 86, 1200}), Bf16Gemm::Amx);
  EXPECT_EQ(choose_bf16_gemm({263, 485, 560}), Bf16Gemm::Dpbf16);  // 1.15x: stay on vdpbf16ps
  EXPECT_EQ(choose_bf16_gemm({179, 86, 200}), Bf16Gemm::Rounded);
}

TEST(Bf16GemmChoice, NamesParseAndBadOnesAreErrors) {
  using kernels::Bf16Gemm;
  EXPECT_EQ(kernels::parse_bf16_gemm("rounded"), Bf16Gemm::Rounded);
  EXPECT_EQ(kernels::parse_bf16_gemm("dpbf16"), Bf16Gemm::Dpbf16);
  EXPECT_STREQ(kernels::bf16_gemm_name(Bf16Gemm::Dpbf16), "dpbf16");
  try {
    kernels::parse_bf16_gemm("fast");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'fast'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dpbf16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kernels::parse_bf16_gemm("amx"), Bf16Gemm::Amx);
  EXPECT_STREQ(kernels::bf16_gemm_name(Bf16Gemm::Amx), "amx");
}

TEST(Bf16GemmChoice, SetOverridesAndUnsupportedIsRefused) {
  using kernels::Bf16Gemm;
  const kernels::Bf16GemmChoice before = kernels::bf16_gemm_choice();
  kernels::set_bf16_gemm(Bf16Gemm::Rounded);
  EXPECT_EQ(kernels::bf16_gemm_choice().kernel, Bf16Gemm::Rounded);
  EXPECT_EQ(kernels::bf16_gemm_choice().source, "set");
  {
    ScopedIsa isa(Isa::Avx512 <= detected_isa() ? Isa::Avx512 : Isa::Reference);
    EXPECT_FALSE(kernels::bf16_gemm_supported(Bf16Gemm::Dpbf16));
    EXPECT_THROW(kernels::set_bf16_gemm(Bf16Gemm::Dpbf16), ValueError);
    EXPECT_THROW(kernels::set_bf16_gemm(Bf16Gemm::Amx), ValueError);
    float x = 1.0f;
    EXPECT_THROW(gemm_bf16(Bf16Gemm::Dpbf16, false, false, 1, 1, 1, &x, 1, &x, 1, &x, 1), ValueError);
  }
  if (kernels::bf16_gemm_supported(Bf16Gemm::Dpbf16)) {
    kernels::set_bf16_gemm(Bf16Gemm::Dpbf16);
    EXPECT_EQ(kernels::bf16_gemm_choice().kernel, Bf16Gemm::Dpbf16);
  }
  kernels::set_bf16_gemm(before.kernel);
}

TEST(Bf16GemmChoice, KnobOverridesTheMeasurement) {
  using kernels::Bf16Gemm;
  using kernels::resolve_bf16_gemm;
  const kernels::Bf16GemmChoice rounded = resolve_bf16_gemm("rounded");
  EXPECT_EQ(rounded.kernel, Bf16Gemm::Rounded);
  EXPECT_EQ(rounded.source, "CORELM_BF16_GEMM");
  for (const char* automatic : {static_cast<const char*>(nullptr), "", "auto"}) {
    const kernels::Bf16GemmChoice c = resolve_bf16_gemm(automatic);
    EXPECT_EQ(c.source, "measured");
    EXPECT_EQ(c.kernel, kernels::choose_bf16_gemm(c.peaks));
    EXPECT_GT(c.peaks.fp32_gflops + (active_isa() == Isa::Reference ? 1 : 0), 0);
  }
  if (kernels::bf16_gemm_supported(Bf16Gemm::Dpbf16)) {
    EXPECT_EQ(resolve_bf16_gemm("dpbf16").kernel, Bf16Gemm::Dpbf16);
  }
  if (!kernels::bf16_gemm_supported(Bf16Gemm::Amx)) {
    EXPECT_THROW(resolve_bf16_gemm("amx"), ValueError);
  }
  {
    ScopedIsa isa(Isa::Reference);
    EXPECT_THROW(resolve_bf16_gemm("dpbf16"), ValueError);
    EXPECT_EQ(resolve_bf16_gemm("auto").kernel, Bf16Gemm::Rounded);
  }
  try {
    resolve_bf16_gemm("turbo");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("CORELM_BF16_GEMM"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace corelm::testing
