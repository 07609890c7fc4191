#include "kernels/cpu/loss_fast.h"

#include <algorithm>
#include <cmath>

#include "corelm/thread_pool.h"
#include "kernels/cpu/vec_fast.h"

namespace corelm::kernels::fast {
namespace {

int64_t row_grain(int64_t v) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(v, 1)); }

}  // namespace

void cross_entropy_forward(const float* logits, const int64_t* targets, int64_t n, int64_t v, int64_t ignore_index,
                           float* row_loss, double* lse) {
  parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (targets[i] == ignore_index) {
        row_loss[i] = 0.0f;
        lse[i] = 0.0;
        continue;
      }
      const float* row = logits + i * v;
      const float m = row_max(row, v);
      // exp_shift_sum writes the exps somewhere: reusing the row itself would destroy the
      // logits, so sum in chunks through a small stack buffer.
      constexpr int64_t kChunk = 1024;
      float buffer[kChunk];
      double total = 0.0;
      for (int64_t j = 0; j < v; j += kChunk) total += exp_shift_sum(row + j, buffer, std::min(kChunk, v - j), m);
      const double log_sum_exp = double(m) + std::log(total);
      lse[i] = log_sum_exp;
      row_loss[i] = static_cast<float>(log_sum_exp - row[targets[i]]);
    }
  });
}

void cross_entropy_backward(const float* logits, const double* lse, const int64_t* targets, int64_t n, int64_t v,
                            int64_t ignore_index, float grad_scale, float* grad_logits) {
  parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* grad_row = grad_logits + i * v;
      if (targets[i] == ignore_index) {
        std::fill(grad_row, grad_row + v, 0.0f);
        continue;
      }
      const float* row = logits + i * v;
      exp_shift_scale(row, grad_row, v, static_cast<float>(lse[i]), grad_scale);
      // p - 1 at the target cancels when p is near 1: expm1 in double keeps it exact.
      grad_row[targets[i]] = static_cast<float>(grad_scale * std::expm1(double(row[targets[i]]) - lse[i]));
    }
  });
}

void cross_entropy_forward_grad_inplace(float* z, const int64_t* targets, int64_t n, int64_t v, int64_t ignore_index,
                                        float grad_scale, float* row_loss) {
  parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = z + i * v;
      if (targets[i] == ignore_index) {
        row_loss[i] = 0.0f;
        std::fill(row, row + v, 0.0f);
        continue;
      }
      const float target_logit = row[targets[i]];  // read before the row is overwritten
      const float m = row_max(row, v);
      const double total = exp_shift_sum(row, row, v, m);
      const double log_sum_exp = double(m) + std::log(total);
      row_loss[i] = static_cast<float>(log_sum_exp - target_logit);
      scale_inplace(row, v, static_cast<float>(grad_scale / total));
      row[targets[i]] = static_cast<float>(grad_scale * std::expm1(double(target_logit) - log_sum_exp));
    }
  });
}

}  // namespace corelm::kernels::fast
