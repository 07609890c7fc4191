// Reference embedding kernels: a row gather and its scatter-add gradient. Ids are already
// validated to lie in [0, V) by the caller.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

// out[i, :] = weight[ids[i], :] for i < n; rows have D elements.
void embedding_forward(const float* weight, int64_t D, const int64_t* ids, int64_t n, float* out);

// grad_weight[ids[i], :] += grad_out[i, :] for i ascending (a fixed order, so repeated ids sum
// deterministically). grad_weight must be zeroed by the caller.
void embedding_backward(const float* grad_out, int64_t D, const int64_t* ids, int64_t n,
                        float* grad_weight);

}  // namespace corelm::kernels::reference
