// AVX2 packed bf16 linear: bf16 pairs widened to fp32, 4 x 16 tile.
#include "kernels/cpu/avx2/gemm_vec.h"
#include "kernels/cpu/linear_bf16_tiles.h"

namespace corelm::kernels::avx2 {

void linear_bf16_block(const LinearBf16Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, void* xbuf,
                       bool x_ready) {
  widen_block<Ymm, 4, 2>(a, m0, m1, p0, p1, xbuf, x_ready);
}

}  // namespace corelm::kernels::avx2
