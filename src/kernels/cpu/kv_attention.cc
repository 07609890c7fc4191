// quant_attention_head's dispatch: the hand-vectorised kernel (kv_attention_tiles.h) for
// active_isa() from Isa::Avx2 up, falling back, for head sizes it does not take, to the portable
// kernel (kv_attention_impl.h) built for the same ISA level. Isa::Reference (CORELM_ISA=reference)
// runs the portable kernel compiled for baseline x86-64: the readable one the tests compare against.
#include "kernels/cpu/kv_attention.h"

#include "corelm/isa.h"

#define CORELM_KV_ATTENTION_NAME quant_attention_head_baseline
#include "kernels/cpu/kv_attention_impl.h"

namespace corelm::kernels {

void quant_attention_head_avx512(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                                 int64_t head, int64_t pos, const CachedAttention& shape, QuantCacheFormats formats);
namespace avx2 {
bool quant_attention_head(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape, QuantCacheFormats formats);
}
namespace avx512 {
bool quant_attention_head(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape, QuantCacheFormats formats);
}

void quant_attention_head(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  const Isa isa = active_isa();
  if (isa >= Isa::Avx512) {
    if (avx512::quant_attention_head(q, k_cache, v_cache, out, head, pos, shape, formats)) return;
    return quant_attention_head_avx512(q, k_cache, v_cache, out, head, pos, shape, formats);
  }
  if (isa == Isa::Avx2 && avx2::quant_attention_head(q, k_cache, v_cache, out, head, pos, shape, formats)) return;
  quant_attention_head_baseline(q, k_cache, v_cache, out, head, pos, shape, formats);
}

}  // namespace corelm::kernels
