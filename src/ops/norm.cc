// RMSNorm (Llama/Qwen): x [..., D] * rsqrt(mean(x^2, -1) + eps) * weight [D]. The backward uses a
// dedicated kernel (one pass over x) rather than composing a dozen elementwise ops. The reference
// path (CORELM_ISA=reference) runs the scalar reference kernels, the others kernels/cpu/norm_fast.h.
#include <vector>

#include "corelm/autograd.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "kernels/cpu/norm_fast.h"
#include "kernels/cpu/reference/norm.h"
#include "ops/op_checks.h"

namespace corelm::ops {

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  detail::check_f32("rms_norm", x, "x");
  detail::check_f32("rms_norm", weight, "weight");
  CORELM_CHECK(x.dim() >= 1, ShapeError, "rms_norm: x must have at least one dim, got ",
               shape_str(x.shape()));
  const int64_t d = x.size(-1);
  CORELM_CHECK(weight.dim() == 1 && weight.size(0) == d, ShapeError, "rms_norm: weight ",
               shape_str(weight.shape()), " must be [", d, "] to match x ", shape_str(x.shape()));
  CORELM_CHECK(eps >= 0.0f, ValueError, "rms_norm: eps must be >= 0, got ", eps);
  const int64_t rows = d > 0 ? x.numel() / d : 0;

  const Tensor xc = x.contiguous(), wc = weight.contiguous();
  Tensor out = Tensor::empty(x.shape());
  const bool record = autograd::needs_grad({x, weight});
  Tensor inv_rms = record ? Tensor::empty({rows}) : Tensor();
  const bool fast = active_isa() != Isa::Reference;
  if (out.numel() > 0) {
    const auto forward = fast ? kernels::fast::rms_norm_forward : kernels::reference::rms_norm_forward;
    forward(xc.data<float>(), wc.data<float>(), out.data<float>(), record ? inv_rms.data<float>() : nullptr, rows, d,
            eps);
  }
  if (record) {
    autograd::record(out, "rms_norm", {x, weight},
                     [sx = xc.detach(), sw = wc.detach(), inv_rms, rows, d, fast](const Tensor& g) {
                       const Tensor gc = g.contiguous();
                       Tensor grad_x = Tensor::empty(sx.shape());
                       Tensor grad_w = Tensor::zeros({d});
                       if (rows > 0 && d > 0) {
                         const auto backward =
                             fast ? kernels::fast::rms_norm_backward : kernels::reference::rms_norm_backward;
                         backward(
                             sx.data<float>(), sw.data<float>(), inv_rms.data<float>(),
                             gc.data<float>(), grad_x.data<float>(), grad_w.data<float>(), rows, d);
                       }
                       return std::vector<Tensor>{grad_x, grad_w};
                     });
  }
  return out;
}

}  // namespace corelm::ops
