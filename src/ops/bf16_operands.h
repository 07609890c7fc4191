// Shared by the ops that honour autocast's bf16 compute (matmul/linear, the fused LM-head losses).
#pragma once
#include "corelm/tensor.h"
#include "kernels/cpu/gemm.h"

namespace corelm::ops::detail {

// A contiguous copy of x with every value rounded to bf16 (nearest-even), kept in fp32 storage.
Tensor rounded_to_bf16(const Tensor& x);

// The kernel of this process's bf16 products, Rounded when the chosen one is not available under
// the active ISA (a test's ScopedIsa): anything else runs on kernels::gemm_bf16(kernel, ...).
kernels::Bf16Gemm bf16_products_kernel();

}  // namespace corelm::ops::detail
