// AVX2 + FMA kernels for the fused inference path; contracts in kernels/cpu/fused.h. Only called
// when active_isa() == Isa::Avx2 (this folder is compiled with AVX2/FMA flags).
#pragma once
#include <cstdint>

#include "kernels/cpu/fused.h"

namespace corelm::kernels::avx2 {

void fused_rms_norm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int64_t rows,
                    int64_t d, float eps);
void fused_rope_inplace(float* x, int64_t heads, const RopeTable& table, int64_t pos);
void fused_swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n);
// Returns false (and does nothing) for head sizes it has no kernel for; the caller falls back.
bool fused_attention_head(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape);

}  // namespace corelm::kernels::avx2
