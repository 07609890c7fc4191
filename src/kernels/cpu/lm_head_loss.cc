#include "kernels/cpu/lm_head_loss.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loss_fast.h"

namespace corelm::kernels {

void lm_head_loss(const LmHeadLoss& a, float* row_loss, float grad_scale, float* grad_hidden, float* grad_weight) {
  const bool grads = grad_hidden != nullptr;
  if (grads && a.n == 0) std::fill(grad_weight, grad_weight + a.v * a.h, 0.0f);
  if (a.n == 0) return;
  // Reused across calls: a fresh 8 MB logits chunk per step would cost page faults every time.
  thread_local std::vector<float> logits;
  const int64_t chunk = std::min(a.n, kLmHeadChunkRows);
  if (logits.size() < static_cast<size_t>(chunk * a.v)) logits.resize(static_cast<size_t>(chunk * a.v));
  std::vector<double> lse(grads ? 0 : chunk);

  for (int64_t r0 = 0; r0 < a.n; r0 += chunk) {
    const int64_t rows = std::min(chunk, a.n - r0);
    float* z = logits.data();
    const float* hid = a.hidden + r0 * a.h;
    if (a.bf16_products)
      gemm_bf16(a.bf16_kernel, false, true, rows, a.v, a.h, hid, a.h, a.weight, a.h, z, a.v);
    else
      gemm_f32(false, true, rows, a.v, a.h, 1.0f, hid, a.h, a.weight, a.h, 0.0f, z, a.v);
    if (a.offset) {
      for (int64_t i = 0; i < rows; ++i) {
        float* row = z + i * a.v;
        for (int64_t j = 0; j < a.v; ++j) row[j] -= a.offset[j];
      }
    }
    if (!grads) {
      fast::cross_entropy_forward(z, a.targets + r0, rows, a.v, a.ignore_index, row_loss + r0, lse.data());
      continue;
    }
    fast::cross_entropy_forward_grad_inplace(z, a.targets + r0, rows, a.v, a.ignore_index, grad_scale, row_loss + r0);
    // z now holds this chunk's scaled softmax gradient G [rows, v].
    if (a.bf16_products) {
      gemm_bf16(a.bf16_kernel, false, false, rows, a.h, a.v, z, a.v, a.weight, a.h, grad_hidden + r0 * a.h, a.h);
      gemm_bf16(a.bf16_kernel, true, false, a.v, a.h, rows, z, a.v, hid, a.h, grad_weight, a.h, r0 != 0);
    } else {
      gemm_f32(false, false, rows, a.h, a.v, 1.0f, z, a.v, a.weight, a.h, 0.0f, grad_hidden + r0 * a.h, a.h);
      gemm_f32(true, false, a.v, a.h, rows, 1.0f, z, a.v, hid, a.h, r0 == 0 ? 0.0f : 1.0f, grad_weight, a.h);
    }
  }
}

}  // namespace corelm::kernels
