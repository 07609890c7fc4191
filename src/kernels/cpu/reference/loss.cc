#include "kernels/cpu/reference/loss.h"

#include <algorithm>
#include <cmath>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {
namespace {

struct RowStats {
  float max_value;
  double sum_exp;  // sum of exp(logit - max_value)
};

RowStats row_stats(const float* row, int64_t v) {
  float max_value = -INFINITY;
  for (int64_t j = 0; j < v; ++j) max_value = std::max(max_value, row[j]);
  double total = 0.0;
  for (int64_t j = 0; j < v; ++j) total += std::exp(double(row[j]) - max_value);
  return {max_value, total};
}

int64_t row_grain(int64_t v) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(v, 1)); }

}  // namespace

void cross_entropy_forward(const float* logits, const int64_t* targets, int64_t n, int64_t v,
                           int64_t ignore_index, float* row_loss) {
  parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (targets[i] == ignore_index) {
        row_loss[i] = 0.0f;
        continue;
      }
      const float* row = logits + i * v;
      const RowStats st = row_stats(row, v);
      const double log_sum_exp = double(st.max_value) + std::log(st.sum_exp);
      row_loss[i] = static_cast<float>(log_sum_exp - row[targets[i]]);
    }
  });
}

void cross_entropy_backward(const float* logits, const int64_t* targets, int64_t n, int64_t v,
                            int64_t ignore_index, float grad_scale, float* grad_logits) {
  parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* grad_row = grad_logits + i * v;
      if (targets[i] == ignore_index) {
        std::fill(grad_row, grad_row + v, 0.0f);
        continue;
      }
      const float* row = logits + i * v;
      const RowStats st = row_stats(row, v);
      for (int64_t j = 0; j < v; ++j) {
        const double prob = std::exp(double(row[j]) - st.max_value) / st.sum_exp;
        const double onehot = j == targets[i] ? 1.0 : 0.0;
        grad_row[j] = static_cast<float>(grad_scale * (prob - onehot));
      }
    }
  });
}

}  // namespace corelm::kernels::reference
