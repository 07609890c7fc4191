// The hand-vectorised attention over an encoded KV cache (kv_quant.h formats), written once over
// vector traits and instantiated by avx2/kv_attention.cc (8 lanes) and avx512/kv_attention.cc
// (16 lanes). Internal linkage on purpose: each copy is compiled with its own -m flags, so no
// function here may be shared between them (and none comes from a header compiled baseline).
//
// Shape of the kernel (the f32 kernel's, avx2/fused.cc): an online softmax over blocks of
// kWidth keys. A block's kWidth scores are kWidth independent dot products, reduced together by
// one transpose-add tree; the block's probabilities then weight its value rows, added into an
// f32 accumulator of head_dim values. Rows are read as 32-value chunks decoded straight into
// registers (never into a dequantised copy of the cache):
//   f32 / bf16 / f16  plain loads; bf16 by a 16-bit shift, f16 by F16C (8 or 16 at a time);
//   q8_0              int8 codes sign-extended to int32 and converted to f32, the dot of the
//                     32-block taken in f32 and multiplied by the block scale once. The query
//                     stays f32 (no int8 query): the only error against the decoded reference is
//                     f32 summation order, ~1e-7 relative, where an int8 query would add ~0.4%;
//   q4_0              the same with the nibbles unpacked by a mask / a shift and 8 subtracted;
//   turbo4 / turbo3   codes unpacked by variable shifts, the Lloyd-Max level looked up by a lane
//                     permute over the codebook held in registers (16 levels: two 8-lane
//                     permutes and a blend on code bit 3 for ymm, one permute for zmm), scores
//                     taken against the rotated query, values summed in the rotated basis and
//                     rotated back once per head.
// Scores and sums run in a fixed order for a given (query, cache row), so a result never depends
// on the batch, the other rows or the thread count. Fast path for head_dim a multiple of 32 up to
// kKvMaxHeadDim; the caller falls back to the portable kernel (kv_attention_impl.h) otherwise.
//
// V provides kWidth, Reg, Codebook and: zero, set1, load, store, add, mul, fmadd (f32 lanes);
// half (one fp16 scalar at a byte address); f16 / bf16 / i8 / q4_lo / q4_hi (kWidth values from
// 2·kWidth, 2·kWidth, kWidth, kWidth, kWidth bytes); codebook(levels, count); t4 (kWidth / 2
// bytes of 4-bit codes) and t3 (kWidth / 8 groups of 3 bytes; reads one byte before the group,
// always inside the row since a block starts with its 2-byte norm) giving levels; transpose_sum
// (lane i = the sum of part[i]'s lanes), reduce_max, reduce_add, exp, below (lanes >= n set to
// a value), nan_from (lanes where s is NaN take s).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kv_attention.h"

namespace corelm::kernels {
namespace {

constexpr int64_t kKvChunk = 32;         // values decoded per step (one q8_0 / q4_0 block)
constexpr int64_t kKvMaxHeadDim = 256;   // the query and the accumulator live on the stack

template <KVFormat F>
constexpr bool kBlockScaled = F == KVFormat::Q8_0 || F == KVFormat::Q4_0 || F == KVFormat::Turbo4 ||
                              F == KVFormat::Turbo3;

// The codebook registers a format needs (the 16 turbo4 or 8 turbo3 levels; none otherwise).
template <class V, KVFormat F>
inline typename V::Codebook codebook_for(const float* levels) {
  return V::codebook(levels, F == KVFormat::Turbo4 ? 16 : F == KVFormat::Turbo3 ? 8 : 0);
}

// The 32 values [c, c + 32) of one encoded head vector as kKvChunk / kWidth registers of codes
// (levels for turbo), and the scale they share (1 for the unscaled formats; n = turbo block).
template <class V, KVFormat F>
inline float read_chunk(const uint8_t* row, int64_t c, int64_t n, const typename V::Codebook& cb,
                        typename V::Reg* x) {
  constexpr int W = V::kWidth, R = kKvChunk / W;
  if constexpr (F == KVFormat::F32) {
    const float* p = reinterpret_cast<const float*>(row) + c;
    for (int r = 0; r < R; ++r) x[r] = V::load(p + r * W);
    return 1.0f;
  } else if constexpr (F == KVFormat::BF16) {
    for (int r = 0; r < R; ++r) x[r] = V::bf16(row + 2 * (c + r * W));
    return 1.0f;
  } else if constexpr (F == KVFormat::F16) {
    for (int r = 0; r < R; ++r) x[r] = V::f16(row + 2 * (c + r * W));
    return 1.0f;
  } else if constexpr (F == KVFormat::Q8_0) {
    const uint8_t* b = row + (c / kQuantBlock) * (2 + kQuantBlock);
    for (int r = 0; r < R; ++r) x[r] = V::i8(b + 2 + r * W);
    return V::half(b);
  } else if constexpr (F == KVFormat::Q4_0) {
    // Byte j holds value j (low nibble) and value j + 16 (high nibble).
    const uint8_t* b = row + (c / kQuantBlock) * (2 + kQuantBlock / 2);
    for (int r = 0; r < R / 2; ++r) {
      x[r] = V::q4_lo(b + 2 + r * W);
      x[R / 2 + r] = V::q4_hi(b + 2 + r * W);
    }
    return V::half(b);
  } else if constexpr (F == KVFormat::Turbo4) {
    const uint8_t* b = row + (c / n) * (2 + n / 2);
    const uint8_t* codes = b + 2 + (c % n) / 2;
    for (int r = 0; r < R; ++r) x[r] = V::t4(codes + r * W / 2, cb);
    return V::half(b);
  } else {  // Turbo3
    const uint8_t* b = row + (c / n) * (2 + 3 * n / 8);
    const uint8_t* groups = b + 2 + 3 * (c % n) / 8;
    for (int r = 0; r < R; ++r) x[r] = V::t3(groups + 3 * (r * W / 8), cb);
    return V::half(b);
  }
}

// q · x̂ of one head vector as lanes still to be added (q pre-scaled, rotated for turbo keys).
template <class V, KVFormat F>
inline typename V::Reg dot_codes(const float* q, const uint8_t* row, int64_t D, int64_t n,
                               const typename V::Codebook& cb) {
  constexpr int W = V::kWidth, R = kKvChunk / W;
  typename V::Reg dot = V::zero();
  for (int64_t c = 0; c < D; c += kKvChunk) {
    typename V::Reg x[R];
    const float s = read_chunk<V, F>(row, c, n, cb, x);
    if constexpr (kBlockScaled<F>) {
      typename V::Reg b = V::mul(V::load(q + c), x[0]);
      for (int r = 1; r < R; ++r) b = V::fmadd(V::load(q + c + r * W), x[r], b);
      dot = V::fmadd(b, V::set1(s), dot);
    } else {
      for (int r = 0; r < R; ++r) dot = V::fmadd(V::load(q + c + r * W), x[r], dot);
    }
  }
  return dot;
}

// The kWidth scores of keys [j0, j0 + kWidth) into out (keys past nk repeat key nk - 1; the
// caller masks them).
template <class V, KVFormat F>
void score_block(const float* q, const uint8_t* K, int64_t rb, int64_t j0, int64_t nk, int64_t D, int64_t n,
                 const float* levels, float* out) {
  constexpr int W = V::kWidth;
  const typename V::Codebook cb = codebook_for<V, F>(levels);
  typename V::Reg part[W];
#pragma GCC unroll 16
  for (int k = 0; k < W; ++k) part[k] = dot_codes<V, F>(q, K + (j0 + (k < nk ? k : nk - 1)) * rb, D, n, cb);
  V::store(out, V::transpose_sum(part));
}

// acc += Σ_k p[k] · x̂(j0 + k) over the block's nk keys, chunk by chunk; even and odd keys add
// into separate registers (two independent FMA chains), summed when the chunk is stored.
template <class V, KVFormat F>
void value_block(const float* p, const uint8_t* Vc, int64_t rb, int64_t j0, int64_t nk, int64_t D, int64_t n,
                 const float* levels, float* acc) {
  constexpr int W = V::kWidth, R = kKvChunk / W;
  const typename V::Codebook cb = codebook_for<V, F>(levels);
  for (int64_t c = 0; c < D; c += kKvChunk) {
    typename V::Reg even[R], odd[R], x[R];
    for (int r = 0; r < R; ++r) {
      even[r] = V::load(acc + c + r * W);
      odd[r] = V::zero();
    }
    const uint8_t* row = Vc + j0 * rb;
    int64_t k = 0;
    for (; k + 1 < nk; k += 2, row += 2 * rb) {
      const typename V::Reg w0 = V::set1(p[k] * read_chunk<V, F>(row, c, n, cb, x));
      for (int r = 0; r < R; ++r) even[r] = V::fmadd(w0, x[r], even[r]);
      const typename V::Reg w1 = V::set1(p[k + 1] * read_chunk<V, F>(row + rb, c, n, cb, x));
      for (int r = 0; r < R; ++r) odd[r] = V::fmadd(w1, x[r], odd[r]);
    }
    if (k < nk) {
      const typename V::Reg w0 = V::set1(p[k] * read_chunk<V, F>(row, c, n, cb, x));
      for (int r = 0; r < R; ++r) even[r] = V::fmadd(w0, x[r], even[r]);
    }
    for (int r = 0; r < R; ++r) V::store(acc + c + r * W, V::add(even[r], odd[r]));
  }
}

using ScoreBlockFn = void (*)(const float*, const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                              const float*, float*);
using ValueBlockFn = void (*)(const float*, const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                              const float*, float*);

template <class V>
ScoreBlockFn score_block_for(KVFormat f) {
  switch (f) {
    case KVFormat::F32: return score_block<V, KVFormat::F32>;
    case KVFormat::BF16: return score_block<V, KVFormat::BF16>;
    case KVFormat::F16: return score_block<V, KVFormat::F16>;
    case KVFormat::Q8_0: return score_block<V, KVFormat::Q8_0>;
    case KVFormat::Q4_0: return score_block<V, KVFormat::Q4_0>;
    case KVFormat::Turbo4: return score_block<V, KVFormat::Turbo4>;
    case KVFormat::Turbo3: return score_block<V, KVFormat::Turbo3>;
  }
  return nullptr;
}

template <class V>
ValueBlockFn value_block_for(KVFormat f) {
  switch (f) {
    case KVFormat::F32: return value_block<V, KVFormat::F32>;
    case KVFormat::BF16: return value_block<V, KVFormat::BF16>;
    case KVFormat::F16: return value_block<V, KVFormat::F16>;
    case KVFormat::Q8_0: return value_block<V, KVFormat::Q8_0>;
    case KVFormat::Q4_0: return value_block<V, KVFormat::Q4_0>;
    case KVFormat::Turbo4: return value_block<V, KVFormat::Turbo4>;
    case KVFormat::Turbo3: return value_block<V, KVFormat::Turbo3>;
  }
  return nullptr;
}

// quant_attention_head's contract (kv_attention.h); false (nothing written) for a head_dim this
// kernel does not take. The per-block work goes through two function pointers chosen once per
// call, so the 7 x 7 format pairs need 7 + 7 instantiations, not 49.
template <class V>
bool attend_quantized(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                      int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  constexpr int W = V::kWidth;
  const int64_t D = shape.head_dim, keys = pos + 1;
  if (D % kKvChunk != 0 || D > kKvMaxHeadDim) return false;
  const int64_t kv_head = head / (shape.q_heads / shape.kv_heads);
  const int64_t krb = kv_row_bytes(formats.k, D), vrb = kv_row_bytes(formats.v, D);
  const int64_t kn = kv_block_values(formats.k, D), vn = kv_block_values(formats.v, D);
  const uint8_t* K = k_cache + kv_head * shape.capacity * krb;
  const uint8_t* Vc = v_cache + kv_head * shape.capacity * vrb;
  const bool turbo_k = kv_format_is_turbo(formats.k), turbo_v = kv_format_is_turbo(formats.v);
  const float* k_levels = turbo_k ? turbo_codebook(turbo_bits(formats.k)) : nullptr;
  const float* v_levels = turbo_v ? turbo_codebook(turbo_bits(formats.v)) : nullptr;
  const ScoreBlockFn scores_of = score_block_for<V>(formats.k);
  const ValueBlockFn values_of = value_block_for<V>(formats.v);

  alignas(64) float qs[kKvMaxHeadDim], acc[kKvMaxHeadDim], blk[W];
  for (int64_t i = 0; i < D; ++i) qs[i] = q[i];
  // Rotation first (the portable kernel's order), then the softmax scale folded into the query.
  if (turbo_k)
    for (int64_t b = 0; b < D; b += kn) turbo_rotate(qs + b, kn);
  for (int64_t i = 0; i < D; i += W) {
    V::store(qs + i, V::mul(V::load(qs + i), V::set1(shape.scale)));
    V::store(acc + i, V::zero());
  }
  float running_max = -INFINITY, total = 0.0f;
  for (int64_t j0 = 0; j0 < keys; j0 += W) {
    const int64_t nk = keys - j0 < W ? keys - j0 : W;
    scores_of(qs, K, krb, j0, nk, D, kn, k_levels, blk);
    const typename V::Reg s = V::below(V::load(blk), static_cast<int>(nk), -INFINITY);
    const float block_max = V::reduce_max(s);
    if (block_max > running_max) {
      const float alpha = std::exp(running_max - block_max);  // 0 on the first block
      for (int64_t i = 0; i < D; i += W) V::store(acc + i, V::mul(V::load(acc + i), V::set1(alpha)));
      total *= alpha;
      running_max = block_max;
    }
    // A NaN score (a NaN block in the cache) stays NaN, as it does in the reference, instead of
    // being clamped by exp's range reduction.
    typename V::Reg p = V::nan_from(V::exp(V::add(s, V::set1(-running_max))), s);
    p = V::below(p, static_cast<int>(nk), 0.0f);
    total += V::reduce_add(p);
    V::store(blk, p);
    values_of(blk, Vc, vrb, j0, nk, D, vn, v_levels, acc);
  }
  if (turbo_v)
    for (int64_t b = 0; b < D; b += vn) turbo_unrotate(acc + b, vn);
  const typename V::Reg inv = V::set1(1.0f / total);
  for (int64_t i = 0; i < D; i += W) V::store(out + i, V::mul(V::load(acc + i), inv));
  return true;
}

}  // namespace
}  // namespace corelm::kernels
