// Reference kernels for sliding-window causal attention with grouped-query heads and optional
// document isolation (the contract is ops::sliding_window_attention in include/corelm/ops.h). Naive
// per-query loops over every key with the visibility predicate spelled out; dot products and
// softmax sums accumulate in double, so this is the accuracy yardstick for the blocked kernel.
#pragma once
#include <cstdint>

#include "kernels/cpu/reference/attention.h"

namespace corelm::kernels::reference {

// The mask shared by every sliding-window kernel. Query at absolute position i sees key j iff
//   j <= i, and (window <= 0 or i - j <= window), and (no doc ids or doc[j] == doc[i]).
// A window W therefore admits W + 1 keys counting the query's own (transformers 4.40.2 Mistral
// convention, checked by tests/oracle/test_sliding_attention_oracle.cc).
struct SlidingMask {
  int64_t window = 0;              // <= 0: unbounded (plain causal)
  const int64_t* doc = nullptr;    // [B, S] document index per key position, or null
};

// q, out: contiguous [B, Hq, T, D]; k, v: contiguous [B, Hkv, S, D]; query t at position S - T + t.
void sliding_attention_forward(const float* q, const float* k, const float* v, float* out,
                               const AttentionDims& dims, const SlidingMask& mask, float scale);

// Recomputes the probabilities and writes all three gradients; grad_k / grad_v sum over the
// query heads sharing a kv head, work split by (batch, kv head) so the order is fixed.
void sliding_attention_backward(const float* q, const float* k, const float* v, const float* grad_out,
                                float* grad_q, float* grad_k, float* grad_v, const AttentionDims& dims,
                                const SlidingMask& mask, float scale);

}  // namespace corelm::kernels::reference
