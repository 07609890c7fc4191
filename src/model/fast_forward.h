// The fast inference path of Decoder::forward_cached: weights packed once (bf16, q/k/v and
// gate/up fused), then a forward over raw fp32 buffers in a reusable per-thread workspace with
// the fused kernels of kernels/cpu/fused.h. Internal to the model component.
#pragma once
#include <cstdint>
#include <vector>

#include "corelm/model.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/gemm.h"

namespace corelm::model {

struct FastLayer {
  std::vector<float> in_norm, post_norm;
  kernels::PackedLinear qkv;      // [Q + 2 KV, H]: q rows, then k, then v (biases fused too)
  kernels::PackedLinear o;        // [H, Q]
  kernels::PackedLinear gate_up;  // [2 I, H]: gate rows, then up rows
  kernels::PackedLinear down;     // [H, I]
};

struct FastWeights {
  std::vector<FastLayer> layers;
  std::vector<float> final_norm;
  kernels::PackedLinear lm_head;  // [V, H]
  Tensor embed;                   // the fp32 embedding parameter (shared, not copied)
  kernels::RopeTable rope;
};

FastWeights pack_fast_weights(const Decoder& decoder);

// Runs the forward for ids [B, T] (already validated by the caller) appended at `start[b]` of
// cache row rows[b]; does not touch the cache lengths.
Tensor fast_forward_cached(const FastWeights& w, const ModelConfig& c, const Tensor& ids, KVCache& cache,
                           const std::vector<int64_t>& rows, const std::vector<int64_t>& start, Logits logits);

// hidden [N, H] contiguous fp32 -> logits [N, V] through the packed LM head.
void fast_lm_head(const FastWeights& w, const float* hidden, int64_t n, float* logits);

}  // namespace corelm::model
