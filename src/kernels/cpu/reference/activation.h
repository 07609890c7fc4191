// Reference (scalar, readable) kernels for the activation family: SiLU, SwiGLU, softmax,
// log-softmax and the dropout mask application. Raw contiguous f32 buffers, explicit sizes.
// Reductions (softmax denominators) accumulate in double in index order, so results do not
// depend on the thread count.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

// y = x * sigmoid(x), computed as x / (1 + exp(-x)) like PyTorch.
void silu_forward(const float* x, float* y, int64_t n);
void silu_backward(const float* x, const float* grad_y, float* grad_x, int64_t n);

// y = silu(gate) * up.
void swiglu_forward(const float* gate, const float* up, float* y, int64_t n);
void swiglu_backward(const float* gate, const float* up, const float* grad_y, float* grad_gate,
                     float* grad_up, int64_t n);

// Softmax / log-softmax over the middle axis of a contiguous [outer, n, inner] array (the op
// maps "any dim" onto this layout). Stable: the row maximum is subtracted before exp.
void softmax_forward(const float* x, float* y, int64_t outer, int64_t n, int64_t inner);
// grad_x = y * (grad_y - sum(grad_y * y)), from the saved output y.
void softmax_backward(const float* y, const float* grad_y, float* grad_x, int64_t outer,
                      int64_t n, int64_t inner);
void log_softmax_forward(const float* x, float* y, int64_t outer, int64_t n, int64_t inner);
// grad_x = grad_y - exp(y) * sum(grad_y), from the saved output y.
void log_softmax_backward(const float* y, const float* grad_y, float* grad_x, int64_t outer,
                          int64_t n, int64_t inner);

// y = keep[i] ? x[i] * scale : 0 (inverted dropout; also its backward with x = grad_y).
void dropout_apply(const float* x, const uint8_t* keep, float scale, float* y, int64_t n);

}  // namespace corelm::kernels::reference
