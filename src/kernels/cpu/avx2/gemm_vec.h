// fp32 vector traits over ymm for the shared GEMM/linear templates (gemm_f32_tiles.h,
// linear_bf16_tiles.h). Internal linkage: included only by translation units in this folder.
#pragma once
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace corelm::kernels::avx2 {
namespace {

struct Ymm {
  static constexpr int kWidth = 8;
  using Reg = __m256;
  static __m256i first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float v) { return _mm256_set1_ps(v); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load_n(const float* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static Reg broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, Reg v, int n) { _mm256_maskstore_ps(p, first(n), v); }
  // 8 packed (even, odd) bf16 pairs -> the even and the odd values as fp32.
  static void widen(const uint16_t* pairs, Reg& even, Reg& odd) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

}  // namespace
}  // namespace corelm::kernels::avx2
