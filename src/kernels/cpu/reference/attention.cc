#include "kernels/cpu/reference/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {
namespace {

double dot(const float* a, const float* b, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += double(a[i]) * b[i];
  return total;
}

// Softmax probabilities of one query row over its visible keys 0..visible-1.
void row_probabilities(const float* q_row, const float* k_head, int64_t visible, int64_t d,
                       float scale, std::vector<double>& probs) {
  probs.resize(visible);
  double max_score = -INFINITY;
  for (int64_t s = 0; s < visible; ++s) {
    probs[s] = dot(q_row, k_head + s * d, d) * scale;
    max_score = std::max(max_score, probs[s]);
  }
  double total = 0.0;
  for (int64_t s = 0; s < visible; ++s) {
    probs[s] = std::exp(probs[s] - max_score);
    total += probs[s];
  }
  for (int64_t s = 0; s < visible; ++s) probs[s] /= total;
}

}  // namespace

void causal_attention_forward(const float* q, const float* k, const float* v, float* out,
                              const AttentionDims& dims, float scale) {
  const int64_t T = dims.q_len, S = dims.kv_len, D = dims.head_dim;
  const int64_t group = dims.q_heads / dims.kv_heads;
  const int64_t rows = dims.batch * dims.q_heads * T;
  parallel_for(rows, std::max<int64_t>(1, 256 / std::max<int64_t>(S, 1)), [&](int64_t begin, int64_t end) {
    std::vector<double> probs;
    std::vector<double> acc(D);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % T;
      const int64_t bh = row / T;  // b * Hq + h
      const int64_t b = bh / dims.q_heads, h = bh % dims.q_heads;
      const int64_t kv_offset = (b * dims.kv_heads + h / group) * S * D;
      const int64_t visible = S - T + t + 1;
      row_probabilities(q + row * D, k + kv_offset, visible, D, scale, probs);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t s = 0; s < visible; ++s) {
        const float* v_row = v + kv_offset + s * D;
        for (int64_t i = 0; i < D; ++i) acc[i] += probs[s] * v_row[i];
      }
      for (int64_t i = 0; i < D; ++i) out[row * D + i] = static_cast<float>(acc[i]);
    }
  });
}

void causal_attention_backward(const float* q, const float* k, const float* v,
                               const float* grad_out, float* grad_q, float* grad_k, float* grad_v,
                               const AttentionDims& dims, float scale) {
  const int64_t T = dims.q_len, S = dims.kv_len, D = dims.head_dim;
  const int64_t group = dims.q_heads / dims.kv_heads;
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> probs, dprobs, dq(D), dk(S * D), dv(S * D);
    for (int64_t bkv = begin; bkv < end; ++bkv) {
      const int64_t b = bkv / dims.kv_heads, kvh = bkv % dims.kv_heads;
      const float* k_head = k + bkv * S * D;
      const float* v_head = v + bkv * S * D;
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t row = (b * dims.q_heads + h) * T + t;
          const float* q_row = q + row * D;
          const float* go_row = grad_out + row * D;
          const int64_t visible = S - T + t + 1;
          row_probabilities(q_row, k_head, visible, D, scale, probs);
          // dP_s = dout . v_s; dScore_s = P_s * (dP_s - sum_j P_j dP_j)
          dprobs.resize(visible);
          double weighted = 0.0;
          for (int64_t s = 0; s < visible; ++s) {
            dprobs[s] = dot(go_row, v_head + s * D, D);
            weighted += probs[s] * dprobs[s];
          }
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t s = 0; s < visible; ++s) {
            const double dscore = probs[s] * (dprobs[s] - weighted) * scale;
            const float* k_row = k_head + s * D;
            for (int64_t i = 0; i < D; ++i) {
              dq[i] += dscore * k_row[i];
              dk[s * D + i] += dscore * q_row[i];
              dv[s * D + i] += probs[s] * go_row[i];
            }
          }
          for (int64_t i = 0; i < D; ++i) grad_q[row * D + i] = static_cast<float>(dq[i]);
        }
      }
      for (int64_t i = 0; i < S * D; ++i) {
        grad_k[bkv * S * D + i] = static_cast<float>(dk[i]);
        grad_v[bkv * S * D + i] = static_cast<float>(dv[i]);
      }
    }
  });
}

}  // namespace corelm::kernels::reference
