#include "kernels/cpu/reference/sliding_attention.h"

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

// Deliberately the predicate as written in the contract, evaluated for every (i, j): the blocked
// kernel derives key ranges from it instead, and the tests compare the two.
bool visible(int64_t i, int64_t j, const int64_t* doc_row, int64_t window) {
  if (j > i) return false;
  if (window > 0 && i - j > window) return false;
  return doc_row == nullptr || doc_row[j] == doc_row[i];
}

// Softmax over all S keys of one query row; invisible keys get probability exactly 0.
void row_probabilities(const float* q_row, const float* k_head, int64_t pos, int64_t S, int64_t d,
                       const int64_t* doc_row, int64_t window, float scale, std::vector<double>& probs) {
  probs.assign(S, 0.0);
  double max_score = -INFINITY;
  for (int64_t j = 0; j < S; ++j) {
    if (!visible(pos, j, doc_row, window)) continue;
    probs[j] = dot(q_row, k_head + j * d, d) * scale;
    max_score = std::max(max_score, probs[j]);
  }
  double total = 0.0;
  for (int64_t j = 0; j < S; ++j) {
    if (!visible(pos, j, doc_row, window)) continue;
    probs[j] = std::exp(probs[j] - max_score);
    total += probs[j];
  }
  for (double& p : probs) p /= total;  // total >= exp(0) from the query's own key
}

}  // namespace

void sliding_attention_forward(const float* q, const float* k, const float* v, float* out,
                               const AttentionDims& dims, const SlidingMask& mask, float scale) {
  const int64_t T = dims.q_len, S = dims.kv_len, D = dims.head_dim;
  const int64_t group = dims.q_heads / dims.kv_heads;
  parallel_for(dims.batch * dims.q_heads * T, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> probs, acc(D);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % T, bh = row / T;
      const int64_t b = bh / dims.q_heads, h = bh % dims.q_heads;
      const int64_t kv_offset = (b * dims.kv_heads + h / group) * S * D;
      const int64_t* doc_row = mask.doc ? mask.doc + b * S : nullptr;
      row_probabilities(q + row * D, k + kv_offset, S - T + t, S, D, doc_row, mask.window, scale, probs);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < S; ++j) {
        if (probs[j] == 0.0) continue;
        for (int64_t i = 0; i < D; ++i) acc[i] += probs[j] * v[kv_offset + j * D + i];
      }
      for (int64_t i = 0; i < D; ++i) out[row * D + i] = static_cast<float>(acc[i]);
    }
  });
}

void sliding_attention_backward(const float* q, const float* k, const float* v, const float* grad_out,
                                float* grad_q, float* grad_k, float* grad_v, const AttentionDims& dims,
                                const SlidingMask& mask, float scale) {
  const int64_t T = dims.q_len, S = dims.kv_len, D = dims.head_dim;
  const int64_t group = dims.q_heads / dims.kv_heads;
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> probs, dprobs(S), dq(D), dk(S * D), dv(S * D);
    for (int64_t bkv = begin; bkv < end; ++bkv) {
      const int64_t b = bkv / dims.kv_heads, kvh = bkv % dims.kv_heads;
      const float* k_head = k + bkv * S * D;
      const float* v_head = v + bkv * S * D;
      const int64_t* doc_row = mask.doc ? mask.doc + b * S : nullptr;
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t row = (b * dims.q_heads + h) * T + t;
          const float* q_row = q + row * D;
          const float* go_row = grad_out + row * D;
          row_probabilities(q_row, k_head, S - T + t, S, D, doc_row, mask.window, scale, probs);
          // dP_j = dout . v_j; dScore_j = P_j (dP_j - sum_l P_l dP_l); invisible keys have P_j = 0.
          double weighted = 0.0;
          for (int64_t j = 0; j < S; ++j) {
            dprobs[j] = probs[j] == 0.0 ? 0.0 : dot(go_row, v_head + j * D, D);
            weighted += probs[j] * dprobs[j];
          }
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t j = 0; j < S; ++j) {
            if (probs[j] == 0.0) continue;
            const double dscore = probs[j] * (dprobs[j] - weighted) * scale;
            const float* k_row = k_head + j * D;
            for (int64_t i = 0; i < D; ++i) {
              dq[i] += dscore * k_row[i];
              dk[j * D + i] += dscore * q_row[i];
              dv[j * D + i] += probs[j] * go_row[i];
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
