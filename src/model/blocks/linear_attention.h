// Log-decay linear attention (docs/HYBRID.md): q/k of d_state features per head, no RoPE, a
// learned per-channel decay a = -exp(decay), ops::linear_attention, then a per-head RMSNorm
// scaled by out_norm and o_proj.
#pragma once
#include "model/blocks/block.h"

namespace corelm::model::blocks {

const Block& linear_attention();

// The deterministic initial `self_attn.decay` row of docs/HYBRID.md for d_state channels:
// lambda_c = 1 - 2^-(1 + 9c/(d_state - 1)), w_c = log(-log lambda_c) (half-lives 1 .. ~700 tokens).
std::vector<float> linear_attention_decay_init(int64_t d_state);

}  // namespace corelm::model::blocks
