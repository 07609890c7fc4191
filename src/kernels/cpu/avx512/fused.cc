// AVX-512F fused kernels. Reductions run in a fixed lane/block order per row, so results are
// independent of the batch and the thread count (but differ from the scalar reference by float
// rounding). Attention uses an online softmax over blocks of 16 keys: scores of a block are
// reduced from 16 per-key partial vectors with one transpose-add tree, so no T x T score matrix
// exists and the value accumulator stays in registers.
#include "kernels/cpu/avx512/fused.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wuninitialized reports
// (a known false positive) when they are inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/avx512/vec_math.h"

namespace corelm::kernels::avx512 {
namespace {

__m512 mul_rounded(__m512 a, __m512 b) { return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// One query head against `keys` cached keys/values of head size 16 * NC. The 16 score chains of
// a block are independent (fully unrolled; a tail block re-reads its last key and masks the
// extra lanes), and the value sum alternates between two accumulator sets, so neither phase
// waits on FMA latency.
template <int NC>
void attention_head(const float* q, const float* K, const float* V, float* out, int64_t keys, float scale) {
  constexpr int64_t D = 16 * NC;
  __m512 qv[NC], acc[NC], acc_odd[NC];
  for (int c = 0; c < NC; ++c) {
    qv[c] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * c), _mm512_set1_ps(scale));
    acc[c] = _mm512_setzero_ps();
    acc_odd[c] = _mm512_setzero_ps();
  }
  float running_max = -INFINITY, total = 0.0f;
  alignas(64) float probs[16];
  for (int64_t j0 = 0; j0 < keys; j0 += 16) {
    const int64_t n = keys - j0 < 16 ? keys - j0 : 16;
    __m512 part[16];
#pragma GCC unroll 16
    for (int64_t i = 0; i < 16; ++i) {
      const float* k = K + (j0 + (i < n ? i : n - 1)) * D;
      __m512 dot = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
      for (int c = 1; c < NC; ++c) dot = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), dot);
      part[i] = dot;
    }
    const __mmask16 valid = tail_mask(n);
    const __m512 scores = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, transpose_sum16(part));
    const float block_max = _mm512_reduce_max_ps(scores);
    if (block_max > running_max) {
      const float alpha = std::exp(running_max - block_max);  // 0 on the first block
      for (int c = 0; c < NC; ++c) {
        acc[c] = _mm512_mul_ps(acc[c], _mm512_set1_ps(alpha));
        acc_odd[c] = _mm512_mul_ps(acc_odd[c], _mm512_set1_ps(alpha));
      }
      total *= alpha;
      running_max = block_max;
    }
    const __m512 p = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(scores, _mm512_set1_ps(running_max))));
    total += _mm512_reduce_add_ps(p);
    _mm512_store_ps(probs, p);
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
      const __m512 p0 = _mm512_set1_ps(probs[i]), p1 = _mm512_set1_ps(probs[i + 1]);
      const float* v0 = V + (j0 + i) * D;
      const float* v1 = v0 + D;
      for (int c = 0; c < NC; ++c) {
        acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * c), acc[c]);
        acc_odd[c] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v1 + 16 * c), acc_odd[c]);
      }
    }
    if (i < n) {
      const __m512 p0 = _mm512_set1_ps(probs[i]);
      const float* v0 = V + (j0 + i) * D;
      for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * c), acc[c]);
    }
  }
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(_mm512_add_ps(acc[c], acc_odd[c]), inv));
}

}  // namespace

void fused_rms_norm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int64_t rows,
                    int64_t d, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (int64_t j = 0; j < d; j += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(tail_mask(d - j), xr + j);
      const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
      const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
      lo = _mm512_fmadd_pd(a, a, lo);
      hi = _mm512_fmadd_pd(b, b, hi);
    }
    const double sum_sq = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
    const float mean_sq = static_cast<float>(sum_sq / double(d));
    const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(mean_sq + eps));
    for (int64_t j = 0; j < d; j += 16) {
      const __mmask16 m = tail_mask(d - j);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + j), scale);
      _mm512_mask_storeu_ps(yr + j, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + j)));
    }
  }
}

void fused_rope_inplace(float* x, int64_t heads, const RopeTable& table, int64_t pos) {
  const int64_t d = table.head_dim, half = d / 2;
  const float* cs = table.cos_at(pos);
  const float* sn = table.sin_at(pos);
  for (int64_t h = 0; h < heads; ++h) {
    float* xh = x + h * d;
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 m = tail_mask(half - i);
      const __m512 lo = _mm512_maskz_loadu_ps(m, xh + i), hi = _mm512_maskz_loadu_ps(m, xh + half + i);
      const __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, sn + i);
      // Rounded multiplies, then the subtract/add, exactly as the reference rounds them: the
      // explicit-rounding forms keep the compiler from contracting them into FMAs.
      _mm512_mask_storeu_ps(xh + i, m, _mm512_sub_ps(mul_rounded(lo, c), mul_rounded(hi, s)));
      _mm512_mask_storeu_ps(xh + half + i, m, _mm512_add_ps(mul_rounded(hi, c), mul_rounded(lo, s)));
    }
  }
}

void fused_swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gu + r * ldgu;
    const float* up = gate + n;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = tail_mask(n - j);
      const __m512 g = _mm512_maskz_loadu_ps(m, gate + j);
      const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
      _mm512_mask_storeu_ps(y + r * ldy + j, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + j)));
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
    case 16: attention_head<1>(q, K, V, out, keys, shape.scale); return true;
    case 32: attention_head<2>(q, K, V, out, keys, shape.scale); return true;
    case 48: attention_head<3>(q, K, V, out, keys, shape.scale); return true;
    case 64: attention_head<4>(q, K, V, out, keys, shape.scale); return true;
    case 80: attention_head<5>(q, K, V, out, keys, shape.scale); return true;
    case 96: attention_head<6>(q, K, V, out, keys, shape.scale); return true;
    case 128: attention_head<8>(q, K, V, out, keys, shape.scale); return true;
    default: return false;
  }
}

}  // namespace corelm::kernels::avx512
