// Reference kernels for causal scaled-dot-product attention with grouped-query heads.
// Straightforward per-query loops: scores, stable softmax, weighted sum of values. Dot products
// and softmax sums accumulate in double (this kernel is the accuracy yardstick for fast ones).
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

struct AttentionDims {
  int64_t batch = 0;
  int64_t q_heads = 0;   // Hq
  int64_t kv_heads = 0;  // Hkv, divides Hq; query head h reads kv head h / (Hq / Hkv)
  int64_t q_len = 0;     // T
  int64_t kv_len = 0;    // S >= T; query t is at absolute position S - T + t
  int64_t head_dim = 0;  // D
};

// q, out: contiguous [B, Hq, T, D]; k, v: contiguous [B, Hkv, S, D].
void causal_attention_forward(const float* q, const float* k, const float* v, float* out,
                              const AttentionDims& dims, float scale);

// Recomputes the probabilities from q and k (nothing saved by the forward) and writes all three
// gradients. grad_k/grad_v sum over the query heads that share a kv head; work is split by
// (batch, kv head) so each gradient element is accumulated by one thread in a fixed order.
void causal_attention_backward(const float* q, const float* k, const float* v,
                               const float* grad_out, float* grad_q, float* grad_k, float* grad_v,
                               const AttentionDims& dims, float scale);

}  // namespace corelm::kernels::reference
