// AVX2 fp32 GEMM block: 6 x 16 register tile (12 ymm accumulators, B panel of 2 ymm).
#include "kernels/cpu/avx2/gemm_vec.h"
#include "kernels/cpu/gemm_f32_tiles.h"

namespace corelm::kernels::avx2 {

void gemm_f32_block(const GemmF32Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* pack) {
  f32_block<Ymm, 6, 2>(g, m0, m1, n0, n1, pack);
}

}  // namespace corelm::kernels::avx2
