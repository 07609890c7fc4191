// AVX-512 fp32 GEMM block: 6 x 64 register tile (24 zmm accumulators, B panel of 4 zmm).
#include "kernels/cpu/avx512/gemm_vec.h"
#include "kernels/cpu/gemm_f32_tiles.h"

namespace corelm::kernels::avx512 {

void gemm_f32_block(const GemmF32Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* pack) {
  f32_block<Zmm, 6, 4>(g, m0, m1, n0, n1, pack);
}

}  // namespace corelm::kernels::avx512
