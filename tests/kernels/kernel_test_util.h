// Shared helpers for the kernel contract tests: seeded matrices, fp64 references, and a
// parameterisation over every ISA path this CPU supports.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "corelm/dtype.h"
#include "corelm/isa.h"

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

// Every path this CPU runs, for INSTANTIATE_TEST_SUITE_P.
inline std::vector<Isa> isa_paths() { return supported_isas(); }
inline std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) { return isa_name(info.param); }

}  // namespace corelm::testing
