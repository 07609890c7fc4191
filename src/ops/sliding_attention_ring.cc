// The ops-level entry of ring-buffer decode (sliding_attention_ring.h): argument checks, then the
// kernel in kernels/cpu/sliding_attention_fast.h.
#include "ops/sliding_attention_ring.h"

#include "corelm/error.h"
#include "kernels/cpu/sliding_attention_fast.h"

namespace corelm::ops {

int64_t sliding_ring_required(int64_t T, int64_t start, int64_t window, int64_t doc_start) {
  return kernels::fast::ring_required_keys(T, start, window, doc_start);
}

void sliding_ring_attention(const float* q, int64_t ldq, const float* k_ring, const float* v_ring, float* out,
                            int64_t ldo, int64_t T, int64_t start, const SlidingRingShape& shape) {
  constexpr const char* op = "sliding_ring_attention";
  CORELM_CHECK(shape.q_heads > 0 && shape.kv_heads > 0 && shape.q_heads % shape.kv_heads == 0, ValueError, op,
               ": query heads must be a positive multiple of kv heads; got q_heads ", shape.q_heads, ", kv_heads ",
               shape.kv_heads);
  CORELM_CHECK(shape.head_dim > 0 && shape.ring > 0, ValueError, op, ": head_dim and ring must be positive; got ",
               shape.head_dim, " and ", shape.ring);
  CORELM_CHECK(T >= 0 && start >= 0 && shape.doc_start >= 0 && shape.doc_start <= start, ValueError, op,
               ": need T >= 0 and 0 <= doc_start <= start; got T ", T, ", start ", start, ", doc_start ",
               shape.doc_start);
  CORELM_CHECK(ldq >= shape.q_heads * shape.head_dim && ldo >= shape.q_heads * shape.head_dim, ValueError, op,
               ": row strides ldq ", ldq, " / ldo ", ldo, " are shorter than q_heads * head_dim = ",
               shape.q_heads * shape.head_dim);
  if (T == 0) return;
  const int64_t need = sliding_ring_required(T, start, shape.window, shape.doc_start);
  CORELM_CHECK(need <= shape.ring, ValueError, op, ": ", T, " queries at position ", start, " with window ",
               shape.window, " need ", need, " live keys but the ring has ", shape.ring, " slots");
  kernels::fast::RingAttention ring;
  ring.q_heads = shape.q_heads;
  ring.kv_heads = shape.kv_heads;
  ring.head_dim = shape.head_dim;
  ring.ring = shape.ring;
  ring.window = shape.window;
  ring.doc_start = shape.doc_start;
  ring.scale = shape.scale;
  kernels::fast::sliding_ring_attention(q, ldq, k_ring, v_ring, out, ldo, T, start, ring);
}

}  // namespace corelm::ops
