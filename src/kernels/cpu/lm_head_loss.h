// Fused LM head + cross-entropy over row chunks: logits = hidden . weight^T - offset are formed
// kLmHeadChunkRows rows at a time in a reused workspace, turned into the row losses and (optionally)
// straight into the softmax gradient, which is pushed through both products before the next chunk.
// The full [n, v] logits are never materialised, and the gradients come out of the same pass, so
// the training step does the three LM-head GEMMs once and touches no page of a [n, v] buffer.
//
// Results do not depend on the thread count: the GEMMs reduce in a fixed order (kernels/cpu/gemm.h),
// each row's log-sum-exp is a per-row kernel (loss_fast.h), and grad_weight sums the chunks in
// order.
#pragma once
#include <cstdint>

#include "kernels/cpu/gemm.h"

namespace corelm::kernels {

// 256 rows: measured best of 64..1024 at the tiny shape (V 16384, H 256): smaller chunks pass over
// grad_weight more often, larger ones spill the logits chunk further out of cache.
inline constexpr int64_t kLmHeadChunkRows = 256;

struct LmHeadLoss {
  const float* hidden = nullptr;   // [n, h] row-major
  const float* weight = nullptr;   // [v, h] row-major (nn.Linear layout)
  const float* offset = nullptr;   // [v] subtracted from every row's logits, or null
  const int64_t* targets = nullptr;  // [n], each in [0, v) or ignore_index
  int64_t n = 0, h = 0, v = 0, ignore_index = -100;
  // The three products on gemm_bf16 with this kernel (hidden, weight and the softmax gradient
  // rounded to bf16, fp32 accumulation) instead of gemm_f32 on the values as given.
  bool bf16_products = false;
  Bf16Gemm bf16_kernel = Bf16Gemm::Dpbf16;
};

// row_loss[i] = logsumexp(z_i) - z_i[target_i] with z_i = hidden_i . weight^T - offset (0 for an
// ignored row). When grad_hidden is not null, also
//   grad_hidden [n, h] = grad_scale * G . weight   and   grad_weight [v, h] = grad_scale * G^T . hidden
// with G = softmax(z) - onehot(target) (zero rows for ignored targets); grad_weight is overwritten.
void lm_head_loss(const LmHeadLoss& a, float* row_loss, float grad_scale, float* grad_hidden, float* grad_weight);

}  // namespace corelm::kernels
