// Causal attention is sliding-window attention with an unbounded window and no documents: the
// reference kernel is written once, in sliding_attention.cc, and these entry points name the
// special case (same loops, same double accumulation, keys past the query's position skipped).
#include "kernels/cpu/reference/attention.h"

#include "kernels/cpu/reference/sliding_attention.h"

namespace corelm::kernels::reference {

void causal_attention_forward(const float* q, const float* k, const float* v, float* out,
                              const AttentionDims& dims, float scale) {
  sliding_attention_forward(q, k, v, out, dims, SlidingMask{}, scale);
}

void causal_attention_backward(const float* q, const float* k, const float* v, const float* grad_out,
                               float* grad_q, float* grad_k, float* grad_v, const AttentionDims& dims, float scale) {
  sliding_attention_backward(q, k, v, grad_out, grad_q, grad_k, grad_v, dims, SlidingMask{}, scale);
}

}  // namespace corelm::kernels::reference
