// Peak probe for `corelm bench gemm`: independent ymm FMA chains, no memory traffic.
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/gemm_paths.h"

namespace corelm::kernels::avx2 {

float fma_peak_loop(int64_t iters) {
  constexpr int kChains = 12;  // > latency x ports, so the FMA units never wait
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.0001f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

}  // namespace corelm::kernels::avx2
