// Baseline x86-64 build of quant_attention_head, and the dispatch to the AVX-512 build.
#include "kernels/cpu/kv_attention.h"

#include "corelm/isa.h"

#define CORELM_KV_ATTENTION_NAME quant_attention_head_baseline
#include "kernels/cpu/kv_attention_impl.h"

namespace corelm::kernels {

void quant_attention_head_avx512(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                                 int64_t head, int64_t pos, const CachedAttention& shape, QuantCacheFormats formats);

void quant_attention_head(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  if (active_isa() >= Isa::Avx512)
    return quant_attention_head_avx512(q, k_cache, v_cache, out, head, pos, shape, formats);
  quant_attention_head_baseline(q, k_cache, v_cache, out, head, pos, shape, formats);
}

}  // namespace corelm::kernels
