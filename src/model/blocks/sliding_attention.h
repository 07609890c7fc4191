// Sliding-window attention (HF `sliding_attention`, Mistral's sliding_window): full attention's
// parameters and RoPE, but query i sees only keys i - W .. i (ops::sliding_window_attention).
#pragma once
#include "model/blocks/block.h"

namespace corelm::model::blocks {

const Block& sliding_attention();

}  // namespace corelm::model::blocks
