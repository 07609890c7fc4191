// Fast RMSNorm (same contract as reference/norm.h): the row sums run through the vectorised
// double-accumulating dot of kernels/cpu/vec_fast.h instead of a serial double loop. Rows are
// independent and grad_weight is summed per column in row order, so nothing depends on the other
// rows' values or on the thread count.
#pragma once
#include <cstdint>

namespace corelm::kernels::fast {

void rms_norm_forward(const float* x, const float* weight, float* y, float* inv_rms, int64_t rows, int64_t d,
                      float eps);

void rms_norm_backward(const float* x, const float* weight, const float* inv_rms, const float* grad_y,
                       float* grad_x, float* grad_weight, int64_t rows, int64_t d);

}  // namespace corelm::kernels::fast
