// Full causal attention (GQA/MQA, RoPE, optional q/k/v and o biases) with its pre-norm and
// residual: x + o(attention(rope(q), rope(k), v)) over h = rms_norm(x), keys and values kept
// in the full per-row KV cache for incremental decoding.
#pragma once
#include "model/blocks/block.h"

namespace corelm::model::blocks {

const Block& full_attention();

// Shared with the sliding-window block (blocks/sliding_attention.cc), whose parameters and
// training forward are full attention's with a window: window 0 is unbounded.
void attention_parameter_shapes(const ModelConfig& c, const std::string& prefix, ShapeList& projections,
                                ShapeList& norms);
Tensor attention_forward(const ModelConfig& c, const LayerParams& p, const Tensor& x, const ForwardContext& ctx,
                         int64_t window);

// The packed weights of both attention kinds: the input norm, q/k/v fused, o.
struct PackedAttention final : PackedBlock {
  std::unique_ptr<ops::PackedVector> in_norm;
  std::unique_ptr<ops::PackedLinear> qkv;  // [Q + 2 KV, H]: q rows, then k, then v (biases fused too)
  std::unique_ptr<ops::PackedLinear> o;    // [H, Q]
};
std::unique_ptr<PackedBlock> pack_attention(const ModelConfig& c, const LayerParams& p,
                                            const ops::InferenceBackend& be, ops::WeightFormat format);

}  // namespace corelm::model::blocks
