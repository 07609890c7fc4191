// Blocked sliding-window causal attention for training and prefill, and its decode form over a
// ring-buffer cache. Same contract and mask as reference/sliding_attention.h.
//
// Training/prefill: per (batch, query head), query rows go in blocks of kSlidingRowBlock. The keys
// a block can see form one contiguous range [lo(first row), last row's position] (lo is
// non-decreasing because positions and document starts are), at most W + block keys wide when
// W > 0. Scores Q·Kᵀ and the output P·V are kernels::gemm_f32 calls over that range only; the
// probabilities are saved as a band of sliding_band_width() columns per query row, so memory is
// O(T·(W + block)) instead of O(T·S). Each GEMM output element is one FMA chain in a fixed order
// and keys outside a row's range contribute exact zeros, so a result depends neither on the other
// sequences of the batch nor on the thread count.
#pragma once
#include <cstdint>

#include "kernels/cpu/reference/sliding_attention.h"

namespace corelm::kernels::fast {

using reference::AttentionDims;
using reference::SlidingMask;

inline constexpr int64_t kSlidingRowBlock = 64;

// Columns of the saved band per query row: min(S, W + kSlidingRowBlock) for W > 0, else S.
int64_t sliding_band_width(int64_t kv_len, int64_t window);

// q, out: contiguous [B, Hq, T, D]; k, v: contiguous [B, Hkv, S, D]. When `band` is not null it
// receives the probabilities [B, Hq, T, sliding_band_width()] for the backward (row t of a block
// starting at key lo stores key lo + c at column c; exact zeros elsewhere).
void sliding_attention_forward(const float* q, const float* k, const float* v, float* out, float* band,
                               const AttentionDims& dims, const SlidingMask& mask, float scale);

// Gradients from the saved band: dP = dO·Vᵀ, dS = P∘(dP − rowsum(P∘dP)), dQ = scale·dS·K,
// dK = scale·dSᵀ·Q, dV = Pᵀ·dO, each over the block's key range. dK and dV sum blocks in row order
// and the query heads of a kv head in head order; work is split by (batch, kv head).
void sliding_attention_backward(const float* q, const float* k, const float* v, const float* band,
                                const float* grad_out, float* grad_q, float* grad_k, float* grad_v,
                                const AttentionDims& dims, const SlidingMask& mask, float scale);

// ---- decode over a ring-buffer cache (no autograd) ----
// One batch row's cache: k_ring / v_ring are f32 [kv_heads, ring, head_dim]; position p lives in
// slot p % ring. T new queries (rows of q_heads * head_dim floats, stride ldq) sit at positions
// start .. start + T - 1, their keys already written. Query at position i attends keys
// max(0, doc_start, i - window (window > 0)) ..= i, which must all still be in the ring:
// ring_required_keys() <= ring (the caller checks). Numerics follow the blocked kernel (scores and
// P·V by gemm_f32, the same row softmax), so it matches the op on the in-order keys to float
// rounding. Scratch is per thread and grows once; out has row stride ldo.
struct RingAttention {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, ring = 0;
  int64_t window = 0;      // same convention as SlidingMask::window
  int64_t doc_start = 0;   // first position of the queries' document (bos isolation); 0: none
  float scale = 1.0f;
};

// Slots the T queries at `start` need live at once (from the oldest key visible to the first
// query to the newest key).
int64_t ring_required_keys(int64_t T, int64_t start, int64_t window, int64_t doc_start);

void sliding_ring_attention(const float* q, int64_t ldq, const float* k_ring, const float* v_ring, float* out,
                            int64_t ldo, int64_t T, int64_t start, const RingAttention& shape);

}  // namespace corelm::kernels::fast
