// Reference kernels for RMSNorm (Llama/Qwen): y = (x * rsqrt(mean(x^2) + eps)) * weight over the
// last axis of a contiguous [rows, d] array. The mean of squares is accumulated in double in
// index order and rounded to f32 before eps is added, then every later step is f32 in the
// order HF uses (normalise, then multiply by the weight).
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

// inv_rms (may be null) receives rsqrt(mean(x^2) + eps) per row, for the backward.
void rms_norm_forward(const float* x, const float* weight, float* y, float* inv_rms, int64_t rows,
                      int64_t d, float eps);

// grad_x = r * (g*w - xhat * mean(g*w*xhat)), grad_weight = sum over rows of g * xhat, where
// xhat = x * r. grad_weight is reduced per column in row order (thread-count independent).
void rms_norm_backward(const float* x, const float* weight, const float* inv_rms,
                       const float* grad_y, float* grad_x, float* grad_weight, int64_t rows,
                       int64_t d);

}  // namespace corelm::kernels::reference
