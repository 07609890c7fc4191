// Fast causal attention for training and prefill: per (batch, head) the scores Q·Kᵀ and the
// output P·V are GEMMs (kernels::gemm_f32), the causal softmax is a vectorised row loop. Same
// contract as reference/attention.h (layouts, GQA head mapping, query t at absolute position
// S - T + t). Query rows are processed in blocks of kAttentionRowBlock, each block touching only
// the keys its last row can see; since every GEMM output element is one FMA chain in a fixed order
// and the skipped keys contribute exact zeros, a result does not depend on the blocking, on the
// other sequences of the batch or on the thread count.
#pragma once
#include <cstdint>

#include "kernels/cpu/reference/attention.h"

namespace corelm::kernels::fast {

using reference::AttentionDims;

inline constexpr int64_t kAttentionRowBlock = 64;

// q, out: contiguous [B, Hq, T, D]; k, v: contiguous [B, Hkv, S, D]. When `probs` is not null it
// receives the probabilities [B, Hq, T, S] (exact zeros where masked) for the backward.
void causal_attention_forward(const float* q, const float* k, const float* v, float* out, float* probs,
                              const AttentionDims& dims, float scale);

// Gradients from the probabilities the forward saved: dP = dO·Vᵀ, dS = P∘(dP − rowsum(P∘dP)),
// dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dO. dK and dV sum the query heads of a kv head in
// head order; work is split by (batch, kv head).
void causal_attention_backward(const float* q, const float* k, const float* v, const float* probs,
                               const float* grad_out, float* grad_q, float* grad_k, float* grad_v,
                               const AttentionDims& dims, float scale);

}  // namespace corelm::kernels::fast
