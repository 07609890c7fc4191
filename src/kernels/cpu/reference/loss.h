// Reference kernels for the fused cross-entropy (stable log-softmax + negative log-likelihood)
// over contiguous logits [n, v]. Targets are already validated by the op: each is either
// ignore_index or in [0, v). Row sums accumulate in double.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

// row_loss[i] = logsumexp(logits[i]) - logits[i, target[i]], or 0 for an ignored row.
void cross_entropy_forward(const float* logits, const int64_t* targets, int64_t n, int64_t v,
                           int64_t ignore_index, float* row_loss);

// grad_logits[i] = grad_scale * (softmax(logits[i]) - onehot(target[i])), zero for ignored rows.
void cross_entropy_backward(const float* logits, const int64_t* targets, int64_t n, int64_t v,
                            int64_t ignore_index, float grad_scale, float* grad_logits);

}  // namespace corelm::kernels::reference
