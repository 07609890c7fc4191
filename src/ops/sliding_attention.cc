// Sliding-window causal attention with grouped-query heads and document isolation (see ops.h for
// the contract). Dispatch as causal_attention: the reference path (CORELM_ISA=reference) runs the
// naive kernel, whose backward recomputes the probabilities; every other path runs the blocked
// kernel (kernels/cpu/sliding_attention_fast.h), which saves a band of probabilities per query row.
#include <cmath>
#include <memory>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "kernels/cpu/reference/sliding_attention.h"
#include "kernels/cpu/sliding_attention_fast.h"
#include "ops/attention_checks.h"
#include "ops/op_checks.h"

namespace corelm::ops {
namespace {

constexpr const char* kOp = "sliding_window_attention";

using DocIds = std::shared_ptr<const std::vector<int64_t>>;

// doc_ids as int64 [B, S] after checking dtype, shape and order; null when not given.
DocIds checked_doc_ids(const Tensor& doc_ids, int64_t B, int64_t S) {
  if (!doc_ids.defined()) return nullptr;
  detail::check_cpu(kOp, doc_ids);
  CORELM_CHECK(doc_ids.dtype() == DType::I32 || doc_ids.dtype() == DType::I64, DTypeError, kOp,
               ": doc_ids must be i32 or i64, got ", dtype_name(doc_ids.dtype()), " ", shape_str(doc_ids.shape()));
  CORELM_CHECK(doc_ids.dim() == 2 && doc_ids.size(0) == B && doc_ids.size(1) == S, ShapeError, kOp,
               ": doc_ids must be [B, S] = [", B, ", ", S, "] (one document index per key), got ",
               shape_str(doc_ids.shape()));
  auto ids = std::make_shared<std::vector<int64_t>>(doc_ids.to_int_vector());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 1; j < S; ++j) {
      const int64_t prev = (*ids)[b * S + j - 1], cur = (*ids)[b * S + j];
      CORELM_CHECK(cur >= prev, ValueError, kOp, ": doc_ids must be non-decreasing along each row; row ", b,
                   " has ", prev, " at key ", j - 1, " then ", cur, " at key ", j);
    }
  }
  return ids;
}

kernels::reference::AttentionDims checked_dims(const Tensor& q, const Tensor& k, const Tensor& v) {
  return detail::checked_attention_dims(kOp, q, k, v);
}

}  // namespace

Tensor sliding_window_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window,
                                const Tensor& doc_ids, std::optional<float> scale) {
  const kernels::reference::AttentionDims dims = checked_dims(q, k, v);
  const DocIds docs = checked_doc_ids(doc_ids, dims.batch, dims.kv_len);
  const float s = scale.value_or(dims.head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(dims.head_dim)) : 1.0f);
  const int64_t w = window > 0 ? window : 0;  // every non-positive window means "unbounded"

  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  Tensor out = Tensor::empty(q.shape());
  const bool want_grad = autograd::needs_grad({q, k, v});
  const bool fast = active_isa() != Isa::Reference;
  const auto mask = [w](const DocIds& d) { return kernels::reference::SlidingMask{w, d ? d->data() : nullptr}; };
  const bool empty = out.numel() == 0 || kc.numel() == 0;

  Tensor band;  // the fast path's saved probabilities [B, Hq, T, band width]
  if (fast && want_grad) {
    band = Tensor::empty({dims.batch, dims.q_heads, dims.q_len, kernels::fast::sliding_band_width(dims.kv_len, w)});
  }
  if (!empty && fast) {
    kernels::fast::sliding_attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(), out.data<float>(),
                                             want_grad ? band.data<float>() : nullptr, dims, mask(docs), s);
  } else if (!empty) {
    kernels::reference::sliding_attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                                  out.data<float>(), dims, mask(docs), s);
  }
  if (!want_grad) return out;
  autograd::record(
      out, "sliding_window_attention", {q, k, v},
      [sq = qc.detach(), sk = kc.detach(), sv = vc.detach(), band, docs, dims, s, fast, mask,
       empty](const Tensor& g) {
        if (empty) return std::vector<Tensor>{Tensor::zeros(sq.shape()), Tensor::zeros(sk.shape()),
                                              Tensor::zeros(sv.shape())};
        // Both kernels write every element of the three gradients.
        Tensor grad_q = Tensor::empty(sq.shape()), grad_k = Tensor::empty(sk.shape()),
               grad_v = Tensor::empty(sv.shape());
        const Tensor gc = g.contiguous();
        if (fast) {
          kernels::fast::sliding_attention_backward(sq.data<float>(), sk.data<float>(), sv.data<float>(),
                                                    band.data<float>(), gc.data<float>(), grad_q.data<float>(),
                                                    grad_k.data<float>(), grad_v.data<float>(), dims, mask(docs), s);
        } else {
          kernels::reference::sliding_attention_backward(sq.data<float>(), sk.data<float>(), sv.data<float>(),
                                                         gc.data<float>(), grad_q.data<float>(), grad_k.data<float>(),
                                                         grad_v.data<float>(), dims, mask(docs), s);
        }
        return std::vector<Tensor>{grad_q, grad_k, grad_v};
      });
  return out;
}

}  // namespace corelm::ops
