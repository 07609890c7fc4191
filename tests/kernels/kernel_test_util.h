// Shared helpers for the kernel contract tests: seeded matrices, fp64 references, and a
// parameterisation over every ISA path this CPU supports.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "corelm/dtype.h"
#include "corelm/isa.h"
#include "corelm/thread_pool.h"

namespace corelm::testing {

inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// op(A)[i, k] and op(B)[k, j] of the GEMM contract, row-major storage.
inline float op_a(const float* A, int64_t lda, bool ta, int64_t i, int64_t k) { return ta ? A[k * lda + i] : A[i * lda + k]; }
inline float op_b(const float* B, int64_t ldb, bool tb, int64_t k, int64_t j) { return tb ? B[j * ldb + k] : B[k * ldb + j]; }

// A packed bf16 linear's output Y (m x n, row stride ldy) against the fp64 product of the
// bf16-rounded X and W plus bias (may be null), within 1e-5 of the products' magnitude; columns
// n .. ldy-1 must still hold Y0 (the kernel writes no padding). Fatal failures: callers check
// HasFatalFailure().
inline void expect_rounded_product(const float* X, int64_t ldx, const float* W, int64_t ldw, const float* bias,
                                   const float* Y, const float* Y0, int64_t ldy, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldy; ++j) {
      if (j >= n) {
        ASSERT_EQ(std::memcmp(&Y[i * ldy + j], &Y0[i * ldy + j], 4), 0) << "padding column written";
        continue;
      }
      double dot = 0, mag = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double p = double(round_bf16(X[i * ldx + t])) * round_bf16(W[j * ldw + t]);
        dot += p;
        mag += std::fabs(p);
      }
      const double b = bias ? bias[j] : 0.0;
      ASSERT_NEAR(Y[i * ldy + j], dot + b, 1e-5 * (mag + std::fabs(b)) + 1e-6)
          << "Y[" << i << "," << j << "] m=" << m << " n=" << n << " k=" << k;
    }
}

// Batch and thread invariance of a linear kernel: `run(X, rows, Y)` computes `rows` rows of n
// outputs from rows of k inputs. Rows 0..m-1 of X must come out bitwise the same at 1 and 2
// threads, with m = 16 rows, alone, and at another position in a larger batch (X holds `big`
// rows, big > m). Fatal failures: callers need not check, this is their last statement.
template <class Run>
void expect_rows_batch_and_thread_invariant(const std::vector<float>& X, int64_t big, int64_t m, int64_t k, int64_t n,
                                            Run&& run) {
  const int64_t offset = 9;
  std::vector<float> full(m * n), threaded(m * n), alone(n), shifted(big * n), rot(big * k), sixteen(16 * n);
  set_num_threads(1);
  run(X.data(), m, full.data());
  set_num_threads(2);
  run(X.data(), m, threaded.data());
  set_num_threads(1);
  ASSERT_EQ(std::memcmp(full.data(), threaded.data(), full.size() * 4), 0) << "thread count changed Y";
  run(X.data(), 16, sixteen.data());
  ASSERT_EQ(std::memcmp(full.data(), sixteen.data(), sixteen.size() * 4), 0) << "m=16 differs from m=" << m;
  for (int64_t r = 0; r < big; ++r) std::memcpy(&rot[r * k], &X[((r - offset + big) % big) * k], k * 4);
  run(rot.data(), big, shifted.data());
  for (int64_t i = 0; i < m; ++i) {
    run(X.data() + i * k, 1, alone.data());
    ASSERT_EQ(std::memcmp(alone.data(), &full[i * n], n * 4), 0) << "row " << i << " alone differs";
    ASSERT_EQ(std::memcmp(&shifted[(i + offset) * n], &full[i * n], n * 4), 0) << "row " << i << " at offset differs";
  }
}

// The same for a GEMM: `gemm(ta, tb, rows, N, K, A, lda, B, ldb, C)` writes C = op(A) op(B) with
// C's row stride N. For each of the four transpose combinations, row i of an M-row product must
// be bitwise the row computed alone, at row i + offset of a `big`-row product (A's rows rotated so
// other rows surround it) and at 2 threads instead of 1. Fatal failures, as above.
template <class Gemm>
void expect_gemm_rows_batch_and_thread_invariant(int64_t M, int64_t N, int64_t K, int64_t big, int64_t offset,
                                                 Gemm&& gemm) {
  for (int combo = 0; combo < 4; ++combo) {
    const bool ta = combo & 1, tb = combo & 2;
    const int64_t lda = ta ? big : K;  // A holds `big` rows; the M-row call reads the first M
    const auto A = random_floats(big * K, 40 + combo), B = random_floats(K * N, 50 + combo);
    const int64_t ldb = tb ? K : N;
    std::vector<float> full(M * N), alone(N), shifted(big * N), threaded(M * N);
    set_num_threads(1);
    gemm(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, full.data());
    set_num_threads(2);
    gemm(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, threaded.data());
    set_num_threads(1);
    ASSERT_EQ(std::memcmp(full.data(), threaded.data(), full.size() * 4), 0) << "thread count changed C";
    std::vector<float> rot(big * K);
    for (int64_t r = 0; r < big; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t src = (r - offset + big) % big;
        (ta ? rot[k * big + r] : rot[r * K + k]) = ta ? A[k * big + src] : A[src * K + k];
      }
    gemm(ta, tb, big, N, K, rot.data(), lda, B.data(), ldb, shifted.data());
    for (int64_t i = 0; i < M; ++i) {
      const float* a_row = ta ? A.data() + i : A.data() + i * K;
      gemm(ta, tb, 1, N, K, a_row, lda, B.data(), ldb, alone.data());
      ASSERT_EQ(std::memcmp(alone.data(), &full[i * N], N * 4), 0) << "row " << i << " alone differs, combo " << combo;
      ASSERT_EQ(std::memcmp(&shifted[(i + offset) * N], &full[i * N], N * 4), 0)
          << "row " << i << " at offset differs, combo " << combo;
    }
  }
}

// Every path this CPU runs, for INSTANTIATE_TEST_SUITE_P.
inline std::vector<Isa> isa_paths() { return supported_isas(); }
inline std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) { return isa_name(info.param); }

}  // namespace corelm::testing
