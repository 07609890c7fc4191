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
    // n is a power of two: shifts and masks, not a division per chunk.
    const int sh = __builtin_ctzll(static_cast<unsigned long long>(n));
    const uint8_t* b = row + (c >> sh) * (2 + n / 2);
    const uint8_t* codes = b + 2 + (c & (n - 1)) / 2;
    for (int r = 0; r < R; ++r) x[r] = V::t4(codes + r * W / 2, cb);
    return V::half(b);
  } else {  // Turbo3
    const int sh = __builtin_ctzll(static_cast<unsigned long long>(n));
    const uint8_t* b = row + (c >> sh) * (2 + 3 * n / 8);
    const uint8_t* groups = b + 2 + 3 * (c & (n - 1)) / 8;
    for (int r = 0; r < R; ++r) x[r] = V::t3(groups + 3 * (r * W / 8), cb);
    return V::half(b);
  }
}

// dot += q[c, c + 32) · (s · x): one chunk's share of a score (q pre-scaled, rotated for turbo
// keys). The same operations for every caller, so a head's score has the same bits whether it is
// computed alone or with the other heads of its group.
template <class V, KVFormat F>
inline void add_chunk_dot(const float* q, const typename V::Reg* x, float s, typename V::Reg& dot) {
  constexpr int W = V::kWidth, R = kKvChunk / W;
  if constexpr (kBlockScaled<F>) {
    typename V::Reg b = V::mul(V::load(q), x[0]);
    for (int r = 1; r < R; ++r) b = V::fmadd(V::load(q + r * W), x[r], b);
    dot = V::fmadd(b, V::set1(s), dot);
  } else {
    for (int r = 0; r < R; ++r) dot = V::fmadd(V::load(q + r * W), x[r], dot);
  }
}

// The kWidth scores of keys [j0, j0 + kWidth) for G query heads (q: head g at g * kKvMaxHeadDim)
// into out[g * kWidth + k]. Each key row is decoded once, chunk by chunk, for all G heads. Lanes
// past nk are garbage the caller masks.
template <class V, KVFormat F, int G>
void score_block(const float* q, const uint8_t* K, int64_t rb, int64_t j0, int64_t nk, int64_t D, int64_t n,
                 const float* levels, float* out) {
  constexpr int W = V::kWidth, R = kKvChunk / W;
  const typename V::Codebook cb = codebook_for<V, F>(levels);
  typename V::Reg x[R];
  if constexpr (G == 1) {  // the W partial sums stay in registers
    typename V::Reg part[W];
#pragma GCC unroll 16
    for (int k = 0; k < W; ++k) {
      const uint8_t* row = K + (j0 + (k < nk ? k : nk - 1)) * rb;
      part[k] = V::zero();
      for (int64_t c = 0; c < D; c += kKvChunk) add_chunk_dot<V, F>(q + c, x, read_chunk<V, F>(row, c, n, cb, x), part[k]);
    }
    V::store(out, V::transpose_sum(part));
  } else {
    alignas(64) float part[G][W][W];
    for (int k = 0; k < W; ++k) {
      typename V::Reg dot[G];
      for (int g = 0; g < G; ++g) dot[g] = V::zero();
      if (k < nk) {
        const uint8_t* row = K + (j0 + k) * rb;
        for (int64_t c = 0; c < D; c += kKvChunk) {
          const float s = read_chunk<V, F>(row, c, n, cb, x);
          for (int g = 0; g < G; ++g) add_chunk_dot<V, F>(q + g * kKvMaxHeadDim + c, x, s, dot[g]);
        }
      }
      for (int g = 0; g < G; ++g) V::store(part[g][k], dot[g]);
    }
    for (int g = 0; g < G; ++g) {
      typename V::Reg p[W];
      for (int k = 0; k < W; ++k) p[k] = V::load(part[g][k]);
      V::store(out + g * W, V::transpose_sum(p));
    }
  }
}

// acc_g += Σ_k p[g * kWidth + k] · x̂(j0 + k) over the block's nk keys for G heads (acc: head g
// at g * kKvMaxHeadDim), chunk by chunk, each value row decoded once for all G heads. One head
// alone adds even and odd keys into separate registers (two FMA chains, summed at the store);
// G heads are G independent chains already.
template <class V, KVFormat F, int G>
void value_block(const float* p, const uint8_t* Vc, int64_t rb, int64_t j0, int64_t nk, int64_t D, int64_t n,
                 const float* levels, float* acc) {
  constexpr int W = V::kWidth, R = kKvChunk / W;
  const typename V::Codebook cb = codebook_for<V, F>(levels);
  for (int64_t c = 0; c < D; c += kKvChunk) {
    typename V::Reg x[R];
    const uint8_t* row = Vc + j0 * rb;
    if constexpr (G == 1) {
      typename V::Reg even[R], odd[R];
      for (int r = 0; r < R; ++r) {
        even[r] = V::load(acc + c + r * W);
        odd[r] = V::zero();
      }
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
    } else {
      typename V::Reg a[G][R];
      for (int g = 0; g < G; ++g)
        for (int r = 0; r < R; ++r) a[g][r] = V::load(acc + g * kKvMaxHeadDim + c + r * W);
      for (int64_t k = 0; k < nk; ++k, row += rb) {
        const float s = read_chunk<V, F>(row, c, n, cb, x);
        for (int g = 0; g < G; ++g) {
          const typename V::Reg w = V::set1(p[g * W + k] * s);
          for (int r = 0; r < R; ++r) a[g][r] = V::fmadd(w, x[r], a[g][r]);
        }
      }
      for (int g = 0; g < G; ++g)
        for (int r = 0; r < R; ++r) V::store(acc + g * kKvMaxHeadDim + c + r * W, a[g][r]);
    }
  }
}

using ScoreBlockFn = void (*)(const float*, const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                              const float*, float*);
using ValueBlockFn = ScoreBlockFn;

template <class V, int G, bool kScores>
ScoreBlockFn block_fn_for(KVFormat f) {
  switch (f) {
    case KVFormat::F32: return kScores ? score_block<V, KVFormat::F32, G> : value_block<V, KVFormat::F32, G>;
    case KVFormat::BF16: return kScores ? score_block<V, KVFormat::BF16, G> : value_block<V, KVFormat::BF16, G>;
    case KVFormat::F16: return kScores ? score_block<V, KVFormat::F16, G> : value_block<V, KVFormat::F16, G>;
    case KVFormat::Q8_0: return kScores ? score_block<V, KVFormat::Q8_0, G> : value_block<V, KVFormat::Q8_0, G>;
    case KVFormat::Q4_0: return kScores ? score_block<V, KVFormat::Q4_0, G> : value_block<V, KVFormat::Q4_0, G>;
    case KVFormat::Turbo4: return kScores ? score_block<V, KVFormat::Turbo4, G> : value_block<V, KVFormat::Turbo4, G>;
    case KVFormat::Turbo3: return kScores ? score_block<V, KVFormat::Turbo3, G> : value_block<V, KVFormat::Turbo3, G>;
  }
  return nullptr;
}

// Heads handled by one pass over the cache: their queries, accumulators and block scores stay in
// L1 (and, for AVX2 with R = 4 registers a chunk, G * R accumulators nearly fill the 16 ymm).
constexpr int kKvMaxGroup = 4;

// G consecutive query heads (q and out: head_dim floats each, one after the other) against one
// kv head's K rows K and V rows Vc, positions 0 ..= keys - 1. The online softmax runs per head
// exactly as it would alone; only the decoding of each cache row is shared. The per-block work
// goes through two function pointers chosen once per call, so the 7 x 7 format pairs need
// 2 x 7 instantiations per G, not 49.
template <class V, int G>
void attend_group(const float* q, const uint8_t* K, const uint8_t* Vc, float* out, int64_t keys,
                  const CachedAttention& shape, QuantCacheFormats formats) {
  constexpr int W = V::kWidth;
  const int64_t D = shape.head_dim;
  const int64_t krb = kv_row_bytes(formats.k, D), vrb = kv_row_bytes(formats.v, D);
  const int64_t kn = kv_block_values(formats.k, D), vn = kv_block_values(formats.v, D);
  const bool turbo_k = kv_format_is_turbo(formats.k), turbo_v = kv_format_is_turbo(formats.v);
  const float* k_levels = turbo_k ? turbo_codebook(turbo_bits(formats.k)) : nullptr;
  const float* v_levels = turbo_v ? turbo_codebook(turbo_bits(formats.v)) : nullptr;
  const ScoreBlockFn scores_of = block_fn_for<V, G, true>(formats.k);
  const ValueBlockFn values_of = block_fn_for<V, G, false>(formats.v);

  alignas(64) float qs[G][kKvMaxHeadDim], acc[G][kKvMaxHeadDim], blk[G * W];
  float running_max[G], total[G];
  for (int g = 0; g < G; ++g) {
    for (int64_t i = 0; i < D; ++i) qs[g][i] = q[g * D + i];
    // Rotation first (the portable kernel's order), then the softmax scale folded into the query.
    if (turbo_k)
      for (int64_t b = 0; b < D; b += kn) turbo_rotate(qs[g] + b, kn);
    for (int64_t i = 0; i < D; i += W) {
      V::store(qs[g] + i, V::mul(V::load(qs[g] + i), V::set1(shape.scale)));
      V::store(acc[g] + i, V::zero());
    }
    running_max[g] = -INFINITY;
    total[g] = 0.0f;
  }
  for (int64_t j0 = 0; j0 < keys; j0 += W) {
    const int nk = static_cast<int>(keys - j0 < W ? keys - j0 : W);
    scores_of(qs[0], K, krb, j0, nk, D, kn, k_levels, blk);
    for (int g = 0; g < G; ++g) {
      const typename V::Reg s = V::below(V::load(blk + g * W), nk, -INFINITY);
      const float block_max = V::reduce_max(s);
      if (block_max > running_max[g]) {
        const float alpha = std::exp(running_max[g] - block_max);  // 0 on the first block
        for (int64_t i = 0; i < D; i += W) V::store(acc[g] + i, V::mul(V::load(acc[g] + i), V::set1(alpha)));
        total[g] *= alpha;
        running_max[g] = block_max;
      }
      // A NaN score (a NaN block in the cache) stays NaN, as it does in the reference, instead of
      // being clamped by exp's range reduction.
      typename V::Reg p = V::nan_from(V::exp(V::add(s, V::set1(-running_max[g]))), s);
      p = V::below(p, nk, 0.0f);
      total[g] += V::reduce_add(p);
      V::store(blk + g * W, p);
    }
    values_of(blk, Vc, vrb, j0, nk, D, vn, v_levels, acc[0]);
  }
  for (int g = 0; g < G; ++g) {
    if (turbo_v)
      for (int64_t b = 0; b < D; b += vn) turbo_unrotate(acc[g] + b, vn);
    const typename V::Reg inv = V::set1(1.0f / total[g]);
    for (int64_t i = 0; i < D; i += W) V::store(out + g * D + i, V::mul(V::load(acc[g] + i), inv));
  }
}

// `heads` consecutive query heads that all read kv head `kv_head` (q / out at the first of them;
// quant_attention_head's contract otherwise, kv_attention.h), in passes of up to kKvMaxGroup
// heads. False (nothing written) for a head_dim this kernel does not take.
template <class V>
bool attend_quantized(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t kv_head,
                      int64_t heads, int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  const int64_t D = shape.head_dim;
  if (D % kKvChunk != 0 || D > kKvMaxHeadDim) return false;
  const uint8_t* K = k_cache + kv_head * shape.capacity * kv_row_bytes(formats.k, D);
  const uint8_t* Vc = v_cache + kv_head * shape.capacity * kv_row_bytes(formats.v, D);
  for (int64_t h = 0; h < heads;) {
    const int64_t left = heads - h;
    const int G = static_cast<int>(left < kKvMaxGroup ? left : kKvMaxGroup);
    const float* qg = q + h * D;
    float* og = out + h * D;
    switch (G) {
      case 1: attend_group<V, 1>(qg, K, Vc, og, pos + 1, shape, formats); break;
      case 2: attend_group<V, 2>(qg, K, Vc, og, pos + 1, shape, formats); break;
      case 3: attend_group<V, 3>(qg, K, Vc, og, pos + 1, shape, formats); break;
      default: attend_group<V, 4>(qg, K, Vc, og, pos + 1, shape, formats); break;
    }
    h += G;
  }
  return true;
}

}  // namespace
}  // namespace corelm::kernels
