// AVX2 + FMA fused kernels, the 8-lane twins of ../avx512/fused.cc. Reductions run in a fixed
// lane/block order per row, so results are independent of the batch and the thread count (but
// differ from the scalar reference by float rounding). Attention uses an online softmax over
// blocks of 8 keys. AVX2 has only 16 vector registers, so unlike the AVX-512 kernel the query and
// the value accumulators live in small stack buffers (L1) and are streamed through registers
// four 8-float chunks at a time.
#include "kernels/cpu/avx2/fused.h"

// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/avx2/vec_math.h"

namespace corelm::kernels::avx2 {
namespace {

// acc[c] += sum over keys i < n of probs[i] * V[i][c] for the chunks [c0, c0 + G): even keys into
// acc, odd keys into acc_odd, so two independent FMA chains per chunk.
template <int G, int64_t D>
void accumulate_values(const float* probs, int64_t n, const float* V, float* acc, float* acc_odd, int c0) {
  __m256 a[G], b[G];
  for (int g = 0; g < G; ++g) {
    a[g] = _mm256_load_ps(acc + 8 * (c0 + g));
    b[g] = _mm256_load_ps(acc_odd + 8 * (c0 + g));
  }
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const __m256 p0 = _mm256_broadcast_ss(probs + i), p1 = _mm256_broadcast_ss(probs + i + 1);
    const float* v0 = V + i * D + 8 * c0;
    for (int g = 0; g < G; ++g) {
      a[g] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + 8 * g), a[g]);
      b[g] = _mm256_fmadd_ps(p1, _mm256_loadu_ps(v0 + D + 8 * g), b[g]);
    }
  }
  if (i < n) {
    const __m256 p0 = _mm256_broadcast_ss(probs + i);
    const float* v0 = V + i * D + 8 * c0;
    for (int g = 0; g < G; ++g) a[g] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + 8 * g), a[g]);
  }
  for (int g = 0; g < G; ++g) {
    _mm256_store_ps(acc + 8 * (c0 + g), a[g]);
    _mm256_store_ps(acc_odd + 8 * (c0 + g), b[g]);
  }
}

// One query head against `keys` cached keys/values of head size 8 * NC. The 8 score chains of a
// block are independent (a tail block re-reads its last key and masks the extra lanes).
template <int NC>
void attention_head(const float* q, const float* K, const float* V, float* out, int64_t keys, float scale) {
  constexpr int64_t D = 8 * NC;
  alignas(32) float qs[D], acc[D], acc_odd[D], probs[8];
  for (int c = 0; c < NC; ++c) {
    _mm256_store_ps(qs + 8 * c, _mm256_mul_ps(_mm256_loadu_ps(q + 8 * c), _mm256_set1_ps(scale)));
    _mm256_store_ps(acc + 8 * c, _mm256_setzero_ps());
    _mm256_store_ps(acc_odd + 8 * c, _mm256_setzero_ps());
  }
  float running_max = -INFINITY, total = 0.0f;
  for (int64_t j0 = 0; j0 < keys; j0 += 8) {
    const int64_t n = keys - j0 < 8 ? keys - j0 : 8;
    __m256 part[8];
#pragma GCC unroll 8
    for (int64_t i = 0; i < 8; ++i) {
      const float* k = K + (j0 + (i < n ? i : n - 1)) * D;
      __m256 dot = _mm256_mul_ps(_mm256_load_ps(qs), _mm256_loadu_ps(k));
      for (int c = 1; c < NC; ++c) dot = _mm256_fmadd_ps(_mm256_load_ps(qs + 8 * c), _mm256_loadu_ps(k + 8 * c), dot);
      part[i] = dot;
    }
    const __m256 valid = _mm256_castsi256_ps(tail_mask(n));
    const __m256 scores = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), transpose_sum8(part), valid);
    const float block_max = reduce_max(scores);
    if (block_max > running_max) {
      const __m256 alpha = _mm256_set1_ps(std::exp(running_max - block_max));  // 0 on the first block
      for (int c = 0; c < NC; ++c) {
        _mm256_store_ps(acc + 8 * c, _mm256_mul_ps(_mm256_load_ps(acc + 8 * c), alpha));
        _mm256_store_ps(acc_odd + 8 * c, _mm256_mul_ps(_mm256_load_ps(acc_odd + 8 * c), alpha));
      }
      total *= _mm256_cvtss_f32(alpha);
      running_max = block_max;
    }
    const __m256 p = _mm256_and_ps(valid, exp_ps(_mm256_sub_ps(scores, _mm256_set1_ps(running_max))));
    total += reduce_add(p);
    _mm256_store_ps(probs, p);
    int c = 0;
    for (; c + 4 <= NC; c += 4) accumulate_values<4, D>(probs, n, V + j0 * D, acc, acc_odd, c);
    if constexpr (NC % 4 >= 2) {
      accumulate_values<2, D>(probs, n, V + j0 * D, acc, acc_odd, c);
      c += 2;
    }
    if constexpr (NC % 2 == 1) accumulate_values<1, D>(probs, n, V + j0 * D, acc, acc_odd, c);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / total);
  for (int c = 0; c < NC; ++c)
    _mm256_storeu_ps(out + 8 * c,
                     _mm256_mul_ps(_mm256_add_ps(_mm256_load_ps(acc + 8 * c), _mm256_load_ps(acc_odd + 8 * c)), inv));
}

}  // namespace

void fused_rms_norm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int64_t rows,
                    int64_t d, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    // Squares summed in double, as the reference does, so long rows lose nothing to the sum.
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (int64_t j = 0; j < d; j += 8) {
      const __m256 v = _mm256_maskload_ps(xr + j, tail_mask(d - j));
      const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
      const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      lo = _mm256_fmadd_pd(a, a, lo);
      hi = _mm256_fmadd_pd(b, b, hi);
    }
    const double sum_sq = reduce_add(_mm256_add_pd(lo, hi));
    const float mean_sq = static_cast<float>(sum_sq / double(d));
    const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(mean_sq + eps));
    for (int64_t j = 0; j < d; j += 8) {
      const __m256i m = tail_mask(d - j);
      const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(xr + j, m), scale);
      _mm256_maskstore_ps(yr + j, m, _mm256_mul_ps(v, _mm256_maskload_ps(weight + j, m)));
    }
  }
}

void fused_rope_inplace(float* x, int64_t heads, const RopeTable& table, int64_t pos) {
  const int64_t d = table.head_dim, half = d / 2;
  const float* cs = table.cos_at(pos);
  const float* sn = table.sin_at(pos);
  for (int64_t h = 0; h < heads; ++h) {
    float* xh = x + h * d;
    for (int64_t i = 0; i < half; i += 8) {
      const __m256i m = tail_mask(half - i);
      const __m256 lo = _mm256_maskload_ps(xh + i, m), hi = _mm256_maskload_ps(xh + half + i, m);
      const __m256 c = _mm256_maskload_ps(cs + i, m), s = _mm256_maskload_ps(sn + i, m);
      // Rounded multiplies, then the subtract/add, exactly as the reference rounds them.
      _mm256_maskstore_ps(xh + i, m, _mm256_sub_ps(mul_rounded(lo, c), mul_rounded(hi, s)));
      _mm256_maskstore_ps(xh + half + i, m, _mm256_add_ps(mul_rounded(hi, c), mul_rounded(lo, s)));
    }
  }
}

void fused_swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gu + r * ldgu;
    const float* up = gate + n;
    for (int64_t j = 0; j < n; j += 8) {
      const __m256i m = tail_mask(n - j);
      const __m256 g = _mm256_maskload_ps(gate + j, m);
      const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g))));
      _mm256_maskstore_ps(y + r * ldy + j, m, _mm256_mul_ps(silu, _mm256_maskload_ps(up + j, m)));
    }
  }
}

bool fused_attention_head(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape) {
  const int64_t D = shape.head_dim;
  const int64_t kv_head = head / (shape.q_heads / shape.kv_heads);
  const float* K = k_cache + kv_head * shape.capacity * D;
  const float* V = v_cache + kv_head * shape.capacity * D;
  const int64_t keys = pos + 1;
  switch (D) {
    case 16: attention_head<2>(q, K, V, out, keys, shape.scale); return true;
    case 32: attention_head<4>(q, K, V, out, keys, shape.scale); return true;
    case 40: attention_head<5>(q, K, V, out, keys, shape.scale); return true;
    case 48: attention_head<6>(q, K, V, out, keys, shape.scale); return true;
    case 64: attention_head<8>(q, K, V, out, keys, shape.scale); return true;
    case 80: attention_head<10>(q, K, V, out, keys, shape.scale); return true;
    case 96: attention_head<12>(q, K, V, out, keys, shape.scale); return true;
    case 128: attention_head<16>(q, K, V, out, keys, shape.scale); return true;
    default: return false;
  }
}

}  // namespace corelm::kernels::avx2
