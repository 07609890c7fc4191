// fp32 vector traits over zmm for the shared GEMM/linear templates (gemm_f32_tiles.h,
// linear_bf16_tiles.h). Internal linkage: included only by translation units in this folder.
#pragma once
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace corelm::kernels::avx512 {
namespace {

struct Zmm {
  static constexpr int kWidth = 16;
  using Reg = __m512;
  static __mmask16 first(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float v) { return _mm512_set1_ps(v); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static Reg broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, Reg v, int n) { _mm512_mask_storeu_ps(p, first(n), v); }
  // 16 packed (even, odd) bf16 pairs -> the even and the odd values as fp32.
  static void widen(const uint16_t* pairs, Reg& even, Reg& odd) {
    const __m512i raw = _mm512_loadu_si512(pairs);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

}  // namespace
}  // namespace corelm::kernels::avx512
