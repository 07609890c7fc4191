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
bool quant_attention_heads(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                           int64_t kv_head, int64_t heads, int64_t pos, const CachedAttention& shape,
                           QuantCacheFormats formats);
}
namespace avx512 {
bool quant_attention_heads(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                           int64_t kv_head, int64_t heads, int64_t pos, const CachedAttention& shape,
                           QuantCacheFormats formats);
}
namespace {

// The vector kernel for the active ISA over `heads` consecutive heads reading kv_head; false when
// there is none (Isa::Reference) or it does not take this head_dim.
bool vector_heads(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t kv_head,
                  int64_t heads, int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  const Isa isa = active_isa();
  if (isa >= Isa::Avx512)
    return avx512::quant_attention_heads(q, k_cache, v_cache, out, kv_head, heads, pos, shape, formats);
  if (isa == Isa::Avx2)
    return avx2::quant_attention_heads(q, k_cache, v_cache, out, kv_head, heads, pos, shape, formats);
  return false;
}

// The portable kernel for the active ISA level.
void portable_head(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                   int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  if (active_isa() >= Isa::Avx512)
    return quant_attention_head_avx512(q, k_cache, v_cache, out, head, pos, shape, formats);
  quant_attention_head_baseline(q, k_cache, v_cache, out, head, pos, shape, formats);
}

}  // namespace

void quant_attention_head(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  const int64_t kv_head = head / (shape.q_heads / shape.kv_heads);
  if (vector_heads(q, k_cache, v_cache, out, kv_head, 1, pos, shape, formats)) return;
  portable_head(q, k_cache, v_cache, out, head, pos, shape, formats);
}

void quant_attention_group(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                           int64_t kv_head, int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  const int64_t G = shape.q_heads / shape.kv_heads, D = shape.head_dim;
  if (vector_heads(q, k_cache, v_cache, out, kv_head, G, pos, shape, formats)) return;
  for (int64_t g = 0; g < G; ++g)
    portable_head(q + g * D, k_cache, v_cache, out + g * D, kv_head * G + g, pos, shape, formats);
}

}  // namespace corelm::kernels
