// Attention of one (query row, query head) against a KV cache stored in the block formats of
// kv_quant.h, reading the codes in place (no dequantised copy of the cache):
//  - q8_0 / q4_0 keys: per 32-block, the dot of the f32 query with the integer codes, times the
//    block scale; values: each block's codes times (probability x scale) added to the output.
//  - bf16 / f16 / f32: converted value by value inside the loops.
//  - turbo keys: the query is rotated once per call (the rotation is orthogonal, so
//    q·x̂ = (Rq)·(s·c)) and each score is the norm times the query's dot with the codebook levels;
//    turbo values: s·c accumulated in the rotated basis, rotated back once at the end.
// From Isa::Avx2 up the work is done by the hand-vectorised kernel (kv_attention_tiles.h: rows
// decoded into registers, online softmax over blocks of 8 / 16 keys) for head_dim a multiple of
// 32 up to 256; otherwise, and at Isa::Reference, by the portable kernel (kv_attention_impl.h).
// Scores and sums are f32 in a fixed order, so a result depends only on the query and the
// row's cache, not on the batch or the threads. Same contract as fused_attention_head (fused.h)
// otherwise: positions 0 ..= pos are attended, query head h reads kv head h / (q_heads / kv_heads).
#pragma once
#include <cstdint>

#include "kernels/cpu/fused.h"
#include "kernels/cpu/kv_quant.h"

namespace corelm::kernels {

// One batch row of the cache: k_cache / v_cache are [kv_heads, capacity, row bytes] with row
// bytes = kv_row_bytes(format, head_dim).
struct QuantCacheFormats {
  KVFormat k = KVFormat::F32, v = KVFormat::F32;
};

void quant_attention_head(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape, QuantCacheFormats formats);

// The same for all q_heads / kv_heads query heads that read kv head `kv_head` (heads
// kv_head * G .. kv_head * G + G - 1): q and out point at the first of them, the G heads' head_dim
// floats one after the other. The vector kernels decode each cache row once for the group
// instead of once per head; each head's output is what quant_attention_head gives it, up to f32
// summation order (bitwise when G is 1), and depends only on the query and the cache row.
void quant_attention_group(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                           int64_t kv_head, int64_t pos, const CachedAttention& shape, QuantCacheFormats formats);

}  // namespace corelm::kernels
