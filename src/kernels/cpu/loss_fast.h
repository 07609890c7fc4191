// Fast cross-entropy over contiguous logits [n, v] (same contract as reference/loss.h): the row's
// log-sum-exp comes from vectorised max / exp / sum (kernels/cpu/vec_fast.h) and is kept for the
// backward, which is then one exp pass per row. Rows are independent (split over the pool), so a
// row's loss and gradient do not depend on the other rows or on the thread count.
#pragma once
#include <cstdint>

namespace corelm::kernels::fast {

// row_loss[i] = lse[i] - logits[i, target[i]] with lse[i] = logsumexp(logits[i]) (kept in double
// for the backward); 0 (and lse 0) for an ignored row.
void cross_entropy_forward(const float* logits, const int64_t* targets, int64_t n, int64_t v, int64_t ignore_index,
                           float* row_loss, double* lse);

// grad_logits[i] = grad_scale * (exp(logits[i] - lse[i]) - onehot(target[i])), zero for ignored rows.
void cross_entropy_backward(const float* logits, const double* lse, const int64_t* targets, int64_t n, int64_t v,
                            int64_t ignore_index, float grad_scale, float* grad_logits);

// Both at once, in place (the fused LM-head loss, lm_head_loss.h): row_loss as above, and each row
// of z becomes grad_scale * (softmax(z_i) - onehot(target_i)) (zeros for an ignored row). One
// max pass, one exp pass that writes the exps over the row and one scaling pass per row.
void cross_entropy_forward_grad_inplace(float* z, const int64_t* targets, int64_t n, int64_t v, int64_t ignore_index,
                                        float grad_scale, float* row_loss);

}  // namespace corelm::kernels::fast
