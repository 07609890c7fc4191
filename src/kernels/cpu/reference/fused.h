// Scalar reference kernels for the fused inference path (contracts in kernels/cpu/fused.h).
// Written for clarity: attention computes all scores of a query, then a stable softmax, then the
// weighted sum of values, with dot products and the softmax sum accumulated in double.
#pragma once
#include <cstdint>

#include "kernels/cpu/fused.h"

namespace corelm::kernels::reference {

void fused_rms_norm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int64_t rows,
                    int64_t d, float eps);
void fused_rope_inplace(float* x, int64_t heads, const RopeTable& table, int64_t pos);
void fused_swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n);
void fused_attention_head(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape);

}  // namespace corelm::kernels::reference
