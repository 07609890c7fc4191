// Peak probe for `corelm bench gemm`: independent vdpbf16ps chains, no memory traffic.
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/gemm_paths.h"

namespace corelm::kernels::avx512_bf16 {

float dpbf16_peak_loop(int64_t iters) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a80);  // 1.0, ~1e-3
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace corelm::kernels::avx512_bf16
