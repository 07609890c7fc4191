// Activations: SiLU, SwiGLU, softmax / log-softmax over any dim, inverted dropout.
// SwiGLU (the MLP's activation, hot in training) runs the vectorised kernel of
// kernels/cpu/vec_fast.h on AVX-512 paths; the rest use the reference kernels on every path.
#include <memory>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "kernels/cpu/reference/activation.h"
#include "kernels/cpu/vec_fast.h"
#include "ops/op_checks.h"

namespace corelm::ops {
namespace {

namespace ref = kernels::reference;

// The [outer, n, inner] view of a contiguous tensor around `dim` (a 0-d tensor is one row of 1).
struct SoftmaxLayout {
  int64_t outer = 1, n = 1, inner = 1;
};

SoftmaxLayout softmax_layout(const char* op, const Tensor& x, int64_t dim) {
  const Shape& shape = x.shape();
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t d = detail::normalize_dim(op, dim, rank == 0 ? 1 : rank, shape);
  SoftmaxLayout layout;
  if (rank == 0) return layout;
  for (int64_t i = 0; i < d; ++i) layout.outer *= shape[i];
  layout.n = shape[d];
  for (int64_t i = d + 1; i < rank; ++i) layout.inner *= shape[i];
  return layout;
}

using SoftmaxKernel = void (*)(const float*, float*, int64_t, int64_t, int64_t);
using SoftmaxBackwardKernel = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t);

// softmax and log_softmax share everything but their kernels; both backwards need only the output.
Tensor softmax_family(const char* op, const Tensor& x, int64_t dim, SoftmaxKernel forward,
                      SoftmaxBackwardKernel backward) {
  detail::check_f32(op, x);
  const SoftmaxLayout layout = softmax_layout(op, x, dim);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  if (x.numel() > 0) forward(xc.data<float>(), out.data<float>(), layout.outer, layout.n, layout.inner);
  if (autograd::needs_grad({x})) {
    autograd::record(out, op, {x}, [y = out.detach(), layout, backward](const Tensor& g) {
      const Tensor gc = g.contiguous();
      Tensor grad = Tensor::empty(y.shape());
      if (y.numel() > 0) {
        backward(y.data<float>(), gc.data<float>(), grad.data<float>(), layout.outer, layout.n,
                 layout.inner);
      }
      return std::vector<Tensor>{grad};
    });
  }
  return out;
}

}  // namespace

Tensor silu(const Tensor& x) {
  detail::check_f32("silu", x);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  if (x.numel() > 0) ref::silu_forward(xc.data<float>(), out.data<float>(), x.numel());
  if (autograd::needs_grad({x})) {
    autograd::record(out, "silu", {x}, [sx = xc.detach()](const Tensor& g) {
      const Tensor gc = g.contiguous();
      Tensor grad = Tensor::empty(sx.shape());
      if (sx.numel() > 0) ref::silu_backward(sx.data<float>(), gc.data<float>(), grad.data<float>(), sx.numel());
      return std::vector<Tensor>{grad};
    });
  }
  return out;
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  detail::check_f32("swiglu", gate, "gate");
  detail::check_f32("swiglu", up, "up");
  CORELM_CHECK(gate.shape() == up.shape(), ShapeError, "swiglu: gate ", shape_str(gate.shape()),
               " and up ", shape_str(up.shape()), " must have the same shape");
  const Tensor gc = gate.contiguous(), uc = up.contiguous();
  Tensor out = Tensor::empty(gate.shape());
  if (out.numel() > 0) kernels::fast::swiglu_forward(gc.data<float>(), uc.data<float>(), out.data<float>(), out.numel());
  if (autograd::needs_grad({gate, up})) {
    autograd::record(out, "swiglu", {gate, up}, [sg = gc.detach(), su = uc.detach()](const Tensor& g) {
      const Tensor grad_c = g.contiguous();
      Tensor grad_gate = Tensor::empty(sg.shape()), grad_up = Tensor::empty(su.shape());
      if (sg.numel() > 0) {
        kernels::fast::swiglu_backward(sg.data<float>(), su.data<float>(), grad_c.data<float>(),
                                       grad_gate.data<float>(), grad_up.data<float>(), sg.numel());
      }
      return std::vector<Tensor>{grad_gate, grad_up};
    });
  }
  return out;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_family("softmax", x, dim, ref::softmax_forward, ref::softmax_backward);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_family("log_softmax", x, dim, ref::log_softmax_forward, ref::log_softmax_backward);
}

// Identity (x itself, same autograd node) when !training or p == 0. Otherwise one
// gen.uniform() per element in row-major order; the element is dropped when u < p.
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  detail::check_f32("dropout", x);
  CORELM_CHECK(p >= 0.0f && p < 1.0f, ValueError, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0.0f) return x;
  const int64_t n = x.numel();
  auto keep = std::make_shared<std::vector<uint8_t>>(n);
  for (int64_t i = 0; i < n; ++i) (*keep)[i] = gen.uniform() < p ? 0 : 1;
  const float scale = 1.0f / (1.0f - p);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  if (n > 0) ref::dropout_apply(xc.data<float>(), keep->data(), scale, out.data<float>(), n);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "dropout", {x}, [keep, scale, shape = x.shape()](const Tensor& g) {
      const Tensor gc = g.contiguous();
      Tensor grad = Tensor::empty(shape);
      if (grad.numel() > 0) {
        ref::dropout_apply(gc.data<float>(), keep->data(), scale, grad.data<float>(), grad.numel());
      }
      return std::vector<Tensor>{grad};
    });
  }
  return out;
}

}  // namespace corelm::ops
