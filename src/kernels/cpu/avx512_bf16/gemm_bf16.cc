// AVX-512 BF16 GEMM block: gemm_bf16_tiles.h on zmm with vdpbf16ps (traits: gemm_bf16_vec.h),
// 6 x 64 register tile (24 accumulators, 4 pair vectors of B, one broadcast pair of A).
#include "kernels/cpu/avx512_bf16/gemm_bf16_vec.h"
#include "kernels/cpu/gemm_bf16_tiles.h"

namespace corelm::kernels::avx512_bf16 {

void gemm_bf16_block(const GemmBf16Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, void* scratch,
                     bool rows_ready) {
  bf16_block<Dp16, 6>(g, m0, m1, n0, n1, scratch, rows_ready);
}

}  // namespace corelm::kernels::avx512_bf16
