// AVX-512 row primitives for the training kernels (contracts in kernels/cpu/vec_fast.h).
// Reductions keep 16 lanes (two 8-lane double accumulators for sums), then fold the lanes in one
// fixed order and add the tail serially: the order depends only on n.
// No standard-library templates here: this file is compiled with AVX-512 flags, and an inline
// library function instantiated here could be picked by the linker for baseline callers.
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/avx512/vec_math.h"
#include "kernels/cpu/vec_fast.h"

namespace corelm::kernels::avx512 {
namespace {

// Lanes 0..15 of two double accumulators, folded in a fixed order.
inline double fold(__m512d lo, __m512d hi) { return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi)); }

inline void add_to_double(__m512 v, __m512d& lo, __m512d& hi) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

inline __m512 sigmoid_ps(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

}  // namespace

float train_row_max(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) m = _mm512_mask_max_ps(m, tail_mask(n - i), m, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  return _mm512_reduce_max_ps(m);
}

double train_exp_shift_sum(const float* x, float* y, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(y + i, e);
    add_to_double(e, lo, hi);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
    _mm512_mask_storeu_ps(y + i, m, e);
    add_to_double(e, lo, hi);
  }
  return fold(lo, hi);
}

void train_exp_shift_scale(const float* x, float* y, int64_t n, float shift, float scale) {
  const __m512 s = _mm512_set1_ps(shift), c = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)), c));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)), c));
  }
}

void train_scale_inplace(float* x, int64_t n, float scale) {
  const __m512 c = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), c));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), c));
  }
}

double train_dot(const float* a, const float* b, int64_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) add_to_double(_mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)), lo, hi);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    add_to_double(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)), lo, hi);
  }
  return fold(lo, hi);
}

void train_softmax_backward_row(const float* p, const float* dp, float* ds, int64_t n, float centre, float scale) {
  const __m512 c = _mm512_set1_ps(centre), s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(dp + i), c);
    _mm512_storeu_ps(ds + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p + i), d), s));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dp + i), c);
    _mm512_mask_storeu_ps(ds + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + i), d), s));
  }
}

void train_swiglu_forward(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid_ps(g)), u));
  }
}

void train_swiglu_backward(const float* gate, const float* up, const float* grad_y, float* grad_gate, float* grad_up,
                           int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 dy = _mm512_maskz_loadu_ps(m, grad_y + i);
    const __m512 s = sigmoid_ps(g);
    // d silu(g) / dg = s * (1 + g * (1 - s))
    const __m512 dsilu = _mm512_mul_ps(s, _mm512_fmadd_ps(g, _mm512_sub_ps(one, s), one));
    _mm512_mask_storeu_ps(grad_up + i, m, _mm512_mul_ps(_mm512_mul_ps(dy, g), s));
    _mm512_mask_storeu_ps(grad_gate + i, m, _mm512_mul_ps(_mm512_mul_ps(dy, u), dsilu));
  }
}

void train_adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const fast::AdamWScalars& s) {
  // The _round_ forms are separately rounded operations the compiler never contracts into FMAs.
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 decay = _mm512_set1_ps(s.decay), beta1 = _mm512_set1_ps(s.beta1), c1 = _mm512_set1_ps(s.one_minus_b1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2), c2 = _mm512_set1_ps(s.one_minus_b2);
  const __m512 bc2 = _mm512_set1_ps(s.bc2_sqrt), eps = _mm512_set1_ps(s.eps), step = _mm512_set1_ps(s.step_size);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 gv = _mm512_maskz_loadu_ps(k, g + i);
    __m512 wv = _mm512_mul_round_ps(_mm512_maskz_loadu_ps(k, w + i), decay, kNearest);
    const __m512 mv = _mm512_add_round_ps(_mm512_mul_round_ps(_mm512_maskz_loadu_ps(k, m + i), beta1, kNearest),
                                          _mm512_mul_round_ps(c1, gv, kNearest), kNearest);
    const __m512 vv = _mm512_add_round_ps(
        _mm512_mul_round_ps(_mm512_maskz_loadu_ps(k, v + i), beta2, kNearest),
        _mm512_mul_round_ps(_mm512_mul_round_ps(c2, gv, kNearest), gv, kNearest), kNearest);
    const __m512 denom =
        _mm512_add_round_ps(_mm512_div_round_ps(_mm512_sqrt_round_ps(vv, kNearest), bc2, kNearest), eps, kNearest);
    wv = _mm512_sub_round_ps(wv, _mm512_mul_round_ps(step, _mm512_div_round_ps(mv, denom, kNearest), kNearest),
                             kNearest);
    _mm512_mask_storeu_ps(w + i, k, wv);
    _mm512_mask_storeu_ps(m + i, k, mv);
    _mm512_mask_storeu_ps(v + i, k, vv);
  }
}

}  // namespace corelm::kernels::avx512
