// Decode for sliding-window attention over a ring-buffer cache, for the model's inference path
// (no autograd, raw f32 pointers). Private to the library: the model includes it instead of
// reaching into kernels/. The mask is the one of ops::sliding_window_attention (include/
// corelm/ops.h): the query at position i sees keys max(doc_start, i - window) ..= i, so a window
// W needs the last W + 1 keys; T queries decoded at once need sliding_ring_required(...) slots.
#pragma once
#include <cstdint>

namespace corelm::ops {

struct SlidingRingShape {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t ring = 0;        // slots per kv head; position p lives in slot sliding_ring_slot(p, ring)
  int64_t window = 0;      // <= 0: unbounded (then the ring must hold every position attended)
  int64_t doc_start = 0;   // first position of the queries' document (bos isolation); 0: none
  float scale = 1.0f;      // usually 1 / sqrt(head_dim)
};

inline int64_t sliding_ring_slot(int64_t position, int64_t ring) { return position % ring; }

// Slots that must be live when T queries start at position `start`: from the oldest key the
// first query sees to the newest key. A ring of window + T slots always suffices (window > 0).
int64_t sliding_ring_required(int64_t T, int64_t start, int64_t window, int64_t doc_start = 0);

// One batch row. k_ring / v_ring: f32 [kv_heads, ring, head_dim], the keys of positions up to
// start + T - 1 already written at their slots. q: T rows of q_heads * head_dim floats (row stride
// ldq) at positions start .. start + T - 1; out: T rows (stride ldo). Query head h reads kv head
// h / (q_heads / kv_heads). Matches sliding_window_attention on the in-order keys to float
// rounding. ValueError if the shape is inconsistent or the ring is smaller than required.
void sliding_ring_attention(const float* q, int64_t ldq, const float* k_ring, const float* v_ring, float* out,
                            int64_t ldo, int64_t T, int64_t start, const SlidingRingShape& shape);

}  // namespace corelm::ops
