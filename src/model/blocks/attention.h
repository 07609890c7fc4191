// Full causal attention (GQA/MQA, RoPE, optional q/k/v and o biases) with its pre-norm and
// residual: x + o(attention(rope(q), rope(k), v)) over h = rms_norm(x), keys and values kept
// in the full per-row KV cache for incremental decoding.
#pragma once
#include "model/blocks/block.h"

namespace corelm::model::blocks {

const Block& full_attention();

}  // namespace corelm::model::blocks
