// Cross-entropy over logits [N, V] and integer targets [N], fused (stable log-softmax + NLL).
// Mean over rows whose target != ignore_index. Deliberate difference from PyTorch: when every row
// is ignored the loss is 0 with a zero gradient (PyTorch returns nan), so a fully padded batch
// cannot poison a run.
// Dispatch: the reference path (CORELM_ISA=reference) runs the scalar reference kernels; every
// other path the vectorised one (kernels/cpu/loss_fast.h), which keeps each row's log-sum-exp for
// the backward instead of recomputing it.
#include <memory>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "kernels/cpu/loss_fast.h"
#include "kernels/cpu/reference/loss.h"
#include "ops/op_checks.h"

namespace corelm::ops {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  detail::check_f32("cross_entropy", logits, "logits");
  detail::check_defined("cross_entropy", targets, "targets");
  detail::check_cpu("cross_entropy", targets);
  CORELM_CHECK(targets.dtype() == DType::I32 || targets.dtype() == DType::I64, DTypeError,
               "cross_entropy: targets must be i32 or i64, got ", dtype_name(targets.dtype()), " ",
               shape_str(targets.shape()));
  CORELM_CHECK(logits.dim() == 2, ShapeError, "cross_entropy: logits must be [N, V], got ",
               shape_str(logits.shape()));
  CORELM_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), ShapeError,
               "cross_entropy: targets must be [N] for logits ", shape_str(logits.shape()), ", got ",
               shape_str(targets.shape()));
  const int64_t n = logits.size(0), v = logits.size(1);

  auto target_ids = std::make_shared<std::vector<int64_t>>(targets.to_int_vector());
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = (*target_ids)[i];
    if (t == ignore_index) continue;
    CORELM_CHECK(t >= 0 && t < v, IndexError, "cross_entropy: target ", t, " at row ", i,
                 " is outside [0, ", v, ") for logits ", shape_str(logits.shape()));
    ++count;
  }

  const Tensor lc = logits.contiguous();
  const bool fast = active_isa() != Isa::Reference;
  std::vector<float> row_loss(n);
  auto lse = std::make_shared<std::vector<double>>(fast ? n : 0);
  if (n > 0 && fast) {
    kernels::fast::cross_entropy_forward(lc.data<float>(), target_ids->data(), n, v, ignore_index, row_loss.data(),
                                         lse->data());
  } else if (n > 0) {
    kernels::reference::cross_entropy_forward(lc.data<float>(), target_ids->data(), n, v,
                                              ignore_index, row_loss.data());
  }
  double total = 0.0;  // fixed row order: thread-count independent
  for (float l : row_loss) total += l;
  Tensor out = Tensor::full({}, count > 0 ? total / double(count) : 0.0);

  if (autograd::needs_grad({logits})) {
    autograd::record(out, "cross_entropy", {logits, targets},
                     [sl = lc.detach(), target_ids, lse, fast, ignore_index, count, n, v](const Tensor& g) {
                       if (count == 0 || sl.numel() == 0) return std::vector<Tensor>{Tensor::zeros(sl.shape()), Tensor()};
                       Tensor grad = Tensor::empty(sl.shape());
                       const float grad_scale = static_cast<float>(g.item() / double(count));
                       if (fast) {
                         kernels::fast::cross_entropy_backward(sl.data<float>(), lse->data(), target_ids->data(), n,
                                                               v, ignore_index, grad_scale, grad.data<float>());
                       } else {
                         kernels::reference::cross_entropy_backward(sl.data<float>(), target_ids->data(), n, v,
                                                                    ignore_index, grad_scale, grad.data<float>());
                       }
                       return std::vector<Tensor>{grad, Tensor()};
                     });
  }
  return out;
}

}  // namespace corelm::ops
