// gemm_f32 on every ISA path against an fp64 computation of the same contract, plus batch and
// thread invariance (a row's result does not depend on the other rows or the thread count).
#include <cmath>
#include <cstring>
#include <limits>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

using kernels::gemm_f32;

const int64_t kSizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 65, 100, 257};

struct Case {
  bool ta, tb;
  int64_t M, N, K, pad;  // pad: extra columns in every leading dimension
  float alpha, beta;
};

// Runs one case and checks every C element (and that C's padding columns are untouched).
void check_case(const Case& c, uint64_t seed) {
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const auto A = random_floats(static_cast<size_t>(a_rows * lda), seed);
  const auto B = random_floats(static_cast<size_t>(b_rows * ldb), seed + 1);
  auto C = random_floats(static_cast<size_t>(c.M * ldc), seed + 2);
  const auto C0 = C;
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= c.N) {
        ASSERT_EQ(std::memcmp(&got, &C0[i * ldc + j], sizeof got), 0) << "padding column " << j << " written";
        continue;
      }
      double dot = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = double(op_a(A.data(), lda, c.ta, i, k)) * op_b(B.data(), ldb, c.tb, k, j);
        dot += p;
        mag += std::fabs(p);
      }
      const double want = c.alpha * dot + (c.beta == 0.0f ? 0.0 : c.beta * double(C0[i * ldc + j]));
      const double tol = 1e-5 * (std::fabs(c.alpha) * mag + std::fabs(c.beta * C0[i * ldc + j])) + 1e-6;
      ASSERT_NEAR(got, want, tol) << "C[" << i << "," << j << "] ta=" << c.ta << " tb=" << c.tb << " M=" << c.M
                                  << " N=" << c.N << " K=" << c.K;
    }
  }
}

class GemmContract : public ::testing::TestWithParam<Isa> {
 protected:
  ScopedIsa isa_{GetParam()};
};

TEST_P(GemmContract, MatchesFp64OverEdgeSizes) {
  uint64_t seed = 1;
  const int64_t ks[] = {1, 17, 64, 257};
  for (int64_t M : kSizes)
    for (int64_t N : kSizes)
      for (int64_t K : ks) {
        const int combo = static_cast<int>(seed % 4);
        check_case({bool(combo & 1), bool(combo & 2), M, N, K, 0, 1.0f, 0.0f}, seed);
        if (HasFatalFailure()) return;
        ++seed;
      }
}

TEST_P(GemmContract, AllTransposesWithStridesAlphaBeta) {
  uint64_t seed = 100;
  const int64_t sizes[] = {1, 3, 16, 17, 65, 100};
  for (int combo = 0; combo < 4; ++combo)
    for (int64_t M : sizes)
      for (int64_t N : sizes)
        for (int64_t K : {int64_t(2), int64_t(33), int64_t(100)}) {
          check_case({bool(combo & 1), bool(combo & 2), M, N, K, 5, 0.75f, -1.25f}, seed++);
          if (HasFatalFailure()) return;
        }
}

TEST_P(GemmContract, LargeBlocksAcrossTaskBoundaries) {
  // Sizes past the 384-row / 256-column task blocks, with K past any cache block.
  check_case({false, true, 400, 530, 300, 0, 1.0f, 0.0f}, 7);
  check_case({true, false, 97, 257, 1030, 3, 1.0f, 1.0f}, 8);
}

TEST_P(GemmContract, BetaZeroOverwritesNaN) {
  const int64_t M = 9, N = 70, K = 20;
  const auto A = random_floats(M * K, 1), B = random_floats(K * N, 2);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN());
  gemm_f32(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  for (float v : C) ASSERT_TRUE(std::isfinite(v));
}

TEST_P(GemmContract, KZeroScalesC) {
  std::vector<float> C(6 * 20, 2.0f);
  const float dummy = 0.0f;
  gemm_f32(false, true, 6, 20, 0, 1.0f, &dummy, 1, &dummy, 1, 0.5f, C.data(), 20);
  for (float v : C) ASSERT_EQ(v, 1.0f);
  gemm_f32(false, true, 6, 20, 0, 1.0f, &dummy, 1, &dummy, 1, 0.0f, C.data(), 20);
  for (float v : C) ASSERT_EQ(v, 0.0f);
}

TEST_P(GemmContract, NegativeSizeIsAnError) {
  float x = 0;
  EXPECT_THROW(gemm_f32(false, false, -1, 2, 2, 1.0f, &x, 2, &x, 2, 0.0f, &x, 2), ValueError);
}

// Row i of a 37-row product, bitwise, equals the row computed alone, at another position among
// other rows, and with 2 threads instead of 1.
TEST_P(GemmContract, RowsAreBatchAndThreadInvariant) {
  // M = 37, N = 300, K = 129, big = 50, offset = 13
  expect_gemm_rows_batch_and_thread_invariant(
      37, 300, 129, 50, 13,
      [](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
         float* C) { gemm_f32(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, n); });
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, GemmContract, ::testing::ValuesIn(isa_paths()), isa_param_name);

}  // namespace
}  // namespace corelm::testing
