// Shared by the ops that honour autocast's bf16 compute (matmul/linear, the fused LM-head losses).
#pragma once
#include "corelm/tensor.h"

namespace corelm::ops::detail {

// A contiguous copy of x with every value rounded to bf16 (nearest-even), kept in fp32 storage.
Tensor rounded_to_bf16(const Tensor& x);

// True when this process's bf16 products run on kernels::gemm_bf16 (the "dpbf16" kernel, and the
// active ISA still has it), false for the rounded-operand fp32 path.
bool bf16_products_on_gemm_bf16();

}  // namespace corelm::ops::detail
