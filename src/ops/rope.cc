// Rotary position embeddings, HF Llama/Qwen rotate-half convention. The op is a rotation of each
// pair (i, i + D/2), so its backward is the same kernel rotating by the opposite angle.
#include <vector>

#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "kernels/cpu/reference/rope.h"
#include "ops/op_checks.h"

namespace corelm::ops {

Tensor rope(const Tensor& x, float theta, int64_t position_offset) {
  detail::check_f32("rope", x, "x");
  CORELM_CHECK(x.dim() == 4, ShapeError, "rope: x must be [B, H, T, D], got ", shape_str(x.shape()));
  const int64_t d = x.size(3);
  CORELM_CHECK(d % 2 == 0, ShapeError, "rope: head dim D must be even, got x ", shape_str(x.shape()));
  CORELM_CHECK(theta > 0.0f, ValueError, "rope: theta must be > 0, got ", theta);
  CORELM_CHECK(position_offset >= 0, ValueError, "rope: position_offset must be >= 0, got ",
               position_offset);
  const int64_t rows = x.size(0) * x.size(1), seq = x.size(2);

  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  if (out.numel() > 0) {
    kernels::reference::rope_apply(xc.data<float>(), out.data<float>(), rows, seq, d, theta,
                                   position_offset, /*inverse=*/false);
  }
  if (autograd::needs_grad({x})) {
    autograd::record(out, "rope", {x}, [shape = x.shape(), rows, seq, d, theta, position_offset](const Tensor& g) {
      const Tensor gc = g.contiguous();
      Tensor grad = Tensor::empty(shape);
      if (grad.numel() > 0) {
        kernels::reference::rope_apply(gc.data<float>(), grad.data<float>(), rows, seq, d, theta,
                                       position_offset, /*inverse=*/true);
      }
      return std::vector<Tensor>{grad};
    });
  }
  return out;
}

}  // namespace corelm::ops
