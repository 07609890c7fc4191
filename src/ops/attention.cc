// Causal scaled-dot-product attention with grouped-query heads (see ops.h for the contract).
// Dispatch: the reference path (CORELM_ISA=reference) runs the scalar reference kernel, whose
// backward recomputes the probabilities from q and k; every other path runs the GEMM-based kernel
// (kernels/cpu/attention_fast.h), whose forward saves the probabilities [B, Hq, T, S] for the
// backward when a gradient is needed.
#include <cmath>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/reference/attention.h"
#include "ops/attention_checks.h"
#include "ops/op_checks.h"

namespace corelm::ops {
namespace {

// The GEMM-based path: forward into `out` from the contiguous qc, kc, vc and, when a gradient is
// wanted, the backward node (on the op's inputs q, k, v) that reuses the saved probabilities.
void attention_fast(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qc, const Tensor& kc,
                    const Tensor& vc, Tensor& out,
                    const kernels::reference::AttentionDims& dims, float s, bool want_grad) {
  Tensor probs;
  if (want_grad) probs = Tensor::empty({dims.batch, dims.q_heads, dims.q_len, dims.kv_len});
  if (out.numel() > 0) {
    kernels::fast::causal_attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(), out.data<float>(),
                                            want_grad ? probs.data<float>() : nullptr, dims, s);
  }
  if (!want_grad) return;
  autograd::record(out, "causal_attention", {q, k, v},
                   [sq = qc.detach(), sk = kc.detach(), sv = vc.detach(), probs, dims, s](const Tensor& g) {
                     const Tensor gc = g.contiguous();
                     if (sq.numel() == 0 || sk.numel() == 0) {
                       return std::vector<Tensor>{Tensor::zeros(sq.shape()), Tensor::zeros(sk.shape()),
                                                  Tensor::zeros(sv.shape())};
                     }
                     Tensor grad_q = Tensor::empty(sq.shape());
                     Tensor grad_k = Tensor::empty(sk.shape());
                     Tensor grad_v = Tensor::empty(sv.shape());
                     kernels::fast::causal_attention_backward(
                         sq.data<float>(), sk.data<float>(), sv.data<float>(), probs.data<float>(), gc.data<float>(),
                         grad_q.data<float>(), grad_k.data<float>(), grad_v.data<float>(), dims, s);
                     return std::vector<Tensor>{grad_q, grad_k, grad_v};
                   });
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<float> scale) {
  const kernels::reference::AttentionDims dims = detail::checked_attention_dims("causal_attention", q, k, v);
  const float s = scale.value_or(dims.head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(dims.head_dim)) : 1.0f);

  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  Tensor out = Tensor::empty(q.shape());
  const bool want_grad = autograd::needs_grad({q, k, v});
  if (active_isa() != Isa::Reference) {
    attention_fast(q, k, v, qc, kc, vc, out, dims, s, want_grad);
    return out;
  }
  if (out.numel() > 0) {
    kernels::reference::causal_attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                                 out.data<float>(), dims, s);
  }
  if (want_grad) {
    autograd::record(out, "causal_attention", {q, k, v},
                     [sq = qc.detach(), sk = kc.detach(), sv = vc.detach(), dims, s](const Tensor& g) {
                       const Tensor gc = g.contiguous();
                       Tensor grad_q = Tensor::zeros(sq.shape());
                       Tensor grad_k = Tensor::zeros(sk.shape());
                       Tensor grad_v = Tensor::zeros(sv.shape());
                       if (sq.numel() > 0 && sk.numel() > 0) {
                         kernels::reference::causal_attention_backward(
                             sq.data<float>(), sk.data<float>(), sv.data<float>(), gc.data<float>(),
                             grad_q.data<float>(), grad_k.data<float>(), grad_v.data<float>(), dims, s);
                       }
                       return std::vector<Tensor>{grad_q, grad_k, grad_v};
                     });
  }
  return out;
}

}  // namespace corelm::ops
