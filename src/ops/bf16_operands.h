// Shared by the ops that honour autocast's bf16 compute (matmul/linear, the fused LM-head losses).
#pragma once
#include "corelm/tensor.h"

namespace corelm::ops::detail {

// A contiguous copy of x with every value rounded to bf16 (nearest-even), kept in fp32 storage.
Tensor rounded_to_bf16(const Tensor& x);

}  // namespace corelm::ops::detail
