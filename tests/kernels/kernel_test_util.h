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

// Every path this CPU runs, for INSTANTIATE_TEST_SUITE_P.
inline std::vector<Isa> isa_paths() { return supported_isas(); }
inline std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) { return isa_name(info.param); }

}  // namespace corelm::testing
