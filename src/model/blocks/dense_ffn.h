// The dense SwiGLU feed-forward block with its pre-norm and residual:
// x + down(silu(gate(h)) * up(h)), h = rms_norm(x). Stateless (no cache).
#pragma once
#include "model/blocks/block.h"

namespace corelm::model::blocks {

const Block& dense_ffn();

}  // namespace corelm::model::blocks
