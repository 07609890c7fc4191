// The channel loops of the chunked linear-attention kernel and of its decode step, included once
// per instruction set: by linear_attention_fast.cc for baseline x86-64 and by
// avx2/linear_attention_loops.cc with the AVX2 + FMA flags, where the compiler maps the fixed
// 8-wide blocks onto ymm registers and fused multiply-adds. Everything here has internal linkage
// and uses no standard-library templates, so the two builds can never be mixed by the linker.
#include <cstdint>

#include "kernels/cpu/linear_attention_loops.h"

namespace corelm::kernels {
namespace {

// Channel loops run in blocks of this many with a fixed trip count (and no aliasing), a shape the
// compiler vectorises at whatever ISA the includer is compiled for; the tail computes the same expression one at a time.
constexpr int64_t kBlock = 8;

// y[i] += a * x[i] * z[i]
inline void add_scaled_product(float* __restrict y, float a, const float* __restrict x, const float* __restrict z,
                               int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t u = 0; u < kBlock; ++u) y[i + u] += a * x[i + u] * z[i + u];
  for (; i < n; ++i) y[i] += a * x[i] * z[i];
}

// Σ_i x[i] y[i] z[i], summed as kBlock interleaved partial sums added in a fixed order at the end
// (the same order for every call of the same n).
inline float dot3(const float* __restrict x, const float* __restrict y, const float* __restrict z, int64_t n) {
  float acc[kBlock] = {};
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t u = 0; u < kBlock; ++u) acc[u] += x[i + u] * y[i + u] * z[i + u];
  float total = 0.0f;
  for (; i < n; ++i) total += x[i] * y[i] * z[i];
  for (int64_t u = 0; u < kBlock; ++u) total += acc[u];
  return total;
}

// y[i] += a * x[i]
inline void add_scaled(float* __restrict y, float a, const float* __restrict x, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t u = 0; u < kBlock; ++u) y[i + u] += a * x[i + u];
  for (; i < n; ++i) y[i] += a * x[i];
}

// y[i] = x[i] * z[i]
inline void product(float* __restrict y, const float* __restrict x, const float* __restrict z, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t u = 0; u < kBlock; ++u) y[i + u] = x[i + u] * z[i + u];
  for (; i < n; ++i) y[i] = x[i] * z[i];
}

// y[i] = d * y[i] + a * x[i] (the decode step's state row update).
inline void decay_add(float* __restrict y, float d, float a, const float* __restrict x, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t u = 0; u < kBlock; ++u) y[i + u] = d * y[i + u] + a * x[i + u];
  for (; i < n; ++i) y[i] = d * y[i] + a * x[i];
}

// The pairs (i, j) of one sub-block [p, end) of a chunk, j from max(doc_start[i], p) to i:
// A[i][j] = Σ_c q_i[c] k_j[c] W[i-j][c].
inline void diag_scores_impl(const la::DiagBlock& b, float* A, int64_t lda) {
  for (int64_t i = b.p; i < b.end; ++i) {
    const float* qi = b.q + i * b.ds;
    const int64_t j0 = b.doc_start[i] > b.p ? b.doc_start[i] : b.p;
    for (int64_t j = j0; j <= i; ++j) A[i * lda + j] = dot3(qi, b.k + j * b.ds, b.W + (i - j) * b.ds, b.ds);
  }
}

// The same pairs' gradients from dA: dq_i += dA_ij k_j ⊙ W[i-j], dk_j += dA_ij q_i ⊙ W[i-j],
// da += (i-j) dA_ij q_i ⊙ k_j ⊙ W[i-j]. dq and dk are chunk rows [len, ds]; kw is scratch [ds].
inline void diag_grads_impl(const la::DiagBlock& b, const float* dA, int64_t lda, float* dq, float* dk, float* da,
                            float* kw) {
  const int64_t ds = b.ds;
  for (int64_t i = b.p; i < b.end; ++i) {
    const float* qi = b.q + i * ds;
    const int64_t j0 = b.doc_start[i] > b.p ? b.doc_start[i] : b.p;
    for (int64_t j = j0; j <= i; ++j) {
      const float x = dA[i * lda + j];
      const float* wd = b.W + (i - j) * ds;
      product(kw, b.k + j * ds, wd, ds);
      add_scaled(dq + i * ds, x, kw, ds);
      add_scaled_product(da, static_cast<float>(i - j) * x, qi, kw, ds);
      add_scaled_product(dk + j * ds, x, qi, wd, ds);
    }
  }
}

// One decode step (contract: linear_attention_fast.h, linear_attention_step).
inline void step_impl(float* state, const float* q, const float* k, const float* v, const float* decay, float* out,
                      int64_t q_heads, int64_t kv_heads, int64_t ds, int64_t dv, float scale) {
  const int64_t group = q_heads / kv_heads;
  for (int64_t g = 0; g < kv_heads; ++g) {
    float* Sg = state + g * ds * dv;
    for (int64_t c = 0; c < ds; ++c) decay_add(Sg + c * dv, decay[g * ds + c], k[g * ds + c], v + g * dv, dv);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      float* o = out + h * dv;
      for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
      for (int64_t c = 0; c < ds; ++c) add_scaled(o, scale * q[h * ds + c], Sg + c * dv, dv);
    }
  }
}

}  // namespace
}  // namespace corelm::kernels
