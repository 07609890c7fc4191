#include "kernels/cpu/attention_fast.h"

#include <algorithm>
#include <vector>

#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_fast.h"

namespace corelm::kernels::fast {
namespace {

struct HeadDims {
  int64_t T, S, D;
  int64_t offset() const { return S - T; }  // keys a query sees beyond its own index
};

// Rows [r0, r1) of p hold scores; each becomes the softmax over its visible keys, zeros after.
void causal_softmax_rows(float* p, int64_t r0, int64_t r1, const HeadDims& hd) {
  for (int64_t t = r0; t < r1; ++t) {
    float* row = p + t * hd.S;
    const int64_t visible = hd.offset() + t + 1;
    const float m = row_max(row, visible);
    const double total = exp_shift_sum(row, row, visible, m);
    scale_inplace(row, visible, static_cast<float>(1.0 / total));
    std::fill(row + visible, row + hd.S, 0.0f);
  }
}

void forward_head(const float* q, const float* k, const float* v, float* out, float* p, const HeadDims& hd,
                  float scale) {
  const int64_t T = hd.T, S = hd.S, D = hd.D;
  for (int64_t r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
    const int64_t r1 = std::min(T, r0 + kAttentionRowBlock);
    const int64_t keys = hd.offset() + r1;  // visible to the block's last row
    gemm_f32(false, true, r1 - r0, keys, D, scale, q + r0 * D, D, k, D, 0.0f, p + r0 * S, S);
    causal_softmax_rows(p, r0, r1, hd);
    gemm_f32(false, false, r1 - r0, D, keys, 1.0f, p + r0 * S, S, v, D, 0.0f, out + r0 * D, D);
  }
}

// grad[S, D] (+)= mᵀ · x for m [T, S] causal (zero where masked) and x [T, D], cut into blocks
// of key rows so each block skips the queries that cannot see it.
void accumulate_transposed(const float* m, const float* x, float* grad, const HeadDims& hd, float beta) {
  const int64_t T = hd.T, S = hd.S, D = hd.D;
  for (int64_t s0 = 0; s0 < S; s0 += kAttentionRowBlock) {
    const int64_t s1 = std::min(S, s0 + kAttentionRowBlock);
    const int64_t t_lo = std::max<int64_t>(0, s0 - hd.offset());  // first query that sees key s0
    gemm_f32(true, false, s1 - s0, D, T - t_lo, 1.0f, m + t_lo * S + s0, S, x + t_lo * D, D, beta,
             grad + s0 * D, D);
  }
}

// One query head's share of the backward; ds is scratch [T, S]. beta = 0 for the first head of a
// kv head (overwrite), 1 after (accumulate in head order).
void backward_head(const float* q, const float* k, const float* v, const float* p, const float* go, float* gq,
                   float* gk, float* gv, float* ds, const HeadDims& hd, float scale, float beta) {
  const int64_t T = hd.T, S = hd.S, D = hd.D;
  accumulate_transposed(p, go, gv, hd, beta);
  for (int64_t r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
    const int64_t r1 = std::min(T, r0 + kAttentionRowBlock);
    const int64_t keys = hd.offset() + r1;
    gemm_f32(false, true, r1 - r0, keys, D, 1.0f, go + r0 * D, D, v, D, 0.0f, ds + r0 * S, S);
    for (int64_t t = r0; t < r1; ++t) {
      const int64_t visible = hd.offset() + t + 1;
      const float* p_row = p + t * S;
      float* row = ds + t * S;
      const float centre = static_cast<float>(dot(p_row, row, visible));
      softmax_backward_row(p_row, row, row, visible, centre, scale);
      std::fill(row + visible, row + S, 0.0f);
    }
    gemm_f32(false, false, r1 - r0, D, keys, 1.0f, ds + r0 * S, S, k, D, 0.0f, gq + r0 * D, D);
  }
  accumulate_transposed(ds, q, gk, hd, beta);
}

}  // namespace

void causal_attention_forward(const float* q, const float* k, const float* v, float* out, float* probs,
                              const AttentionDims& dims, float scale) {
  const HeadDims hd{dims.q_len, dims.kv_len, dims.head_dim};
  const int64_t group = dims.q_heads / dims.kv_heads;
  parallel_for(dims.batch * dims.q_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(probs ? 0 : static_cast<size_t>(hd.T * hd.S));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / dims.q_heads, h = bh % dims.q_heads;
      const int64_t kv_offset = (b * dims.kv_heads + h / group) * hd.S * hd.D;
      float* p = probs ? probs + bh * hd.T * hd.S : scratch.data();
      forward_head(q + bh * hd.T * hd.D, k + kv_offset, v + kv_offset, out + bh * hd.T * hd.D, p, hd, scale);
    }
  });
}

void causal_attention_backward(const float* q, const float* k, const float* v, const float* probs,
                               const float* grad_out, float* grad_q, float* grad_k, float* grad_v,
                               const AttentionDims& dims, float scale) {
  const HeadDims hd{dims.q_len, dims.kv_len, dims.head_dim};
  const int64_t group = dims.q_heads / dims.kv_heads;
  const int64_t q_head = hd.T * hd.D, kv_head = hd.S * hd.D;
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ds(static_cast<size_t>(hd.T * hd.S));
    for (int64_t bkv = begin; bkv < end; ++bkv) {
      const int64_t b = bkv / dims.kv_heads, kvh = bkv % dims.kv_heads;
      for (int64_t r = 0; r < group; ++r) {
        const int64_t bh = b * dims.q_heads + kvh * group + r;
        backward_head(q + bh * q_head, k + bkv * kv_head, v + bkv * kv_head, probs + bh * hd.T * hd.S,
                      grad_out + bh * q_head, grad_q + bh * q_head, grad_k + bkv * kv_head, grad_v + bkv * kv_head,
                      ds.data(), hd, scale, r == 0 ? 0.0f : 1.0f);
      }
    }
  });
}

}  // namespace corelm::kernels::fast
