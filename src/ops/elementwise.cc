// Elementwise ops with PyTorch broadcasting. Binary ops broadcast both inputs to a common shape
// and hand the kernel per-dimension strides (0 where an input is broadcast), so no broadcast
// copy is materialised; gradients of broadcast inputs are summed back with sum_to.
#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "kernels/cpu/reference/elementwise.h"
#include "ops/op_checks.h"

namespace corelm::ops {
namespace {
namespace ref = kernels::reference;
using detail::check_f32;

// Strides that read `x` (contiguous) as if it had `out_shape`: right-aligned, 0 on broadcast dims.
Strides broadcast_strides(const Tensor& x, const Shape& out_shape) {
  const Strides own = contiguous_strides(x.shape());
  const size_t offset = out_shape.size() - x.shape().size();
  Strides s(out_shape.size(), 0);
  for (size_t d = 0; d < x.shape().size(); ++d)
    s[offset + d] = x.shape()[d] == 1 ? 0 : own[d];
  return s;
}

Tensor binary_forward(const char* name, ref::BinaryOp op, const Tensor& a, const Tensor& b) {
  check_f32(name, a, "a");
  check_f32(name, b, "b");
  Shape out_shape;
  try {
    out_shape = broadcast_shapes(a.shape(), b.shape());
  } catch (const ShapeError& e) {
    throw ShapeError(::corelm::detail::concat(name, ": cannot broadcast a ", shape_str(a.shape()), " with b ",
                                    shape_str(b.shape())));
  }
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor out = Tensor::empty(out_shape);
  const Strides sa = broadcast_strides(ac, out_shape), sb = broadcast_strides(bc, out_shape);
  ref::binary(op, static_cast<int64_t>(out_shape.size()), out_shape.data(), ac.data<float>(),
              sa.data(), bc.data<float>(), sb.data(), out.data<float>());
  return out;
}

Tensor unary_forward(const char* name, ref::UnaryOp op, const Tensor& x, float param = 0.0f) {
  check_f32(name, x);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  ref::unary(op, xc.numel(), xc.data<float>(), out.data<float>(), param);
  return out;
}

// Only the inputs that need a gradient get one computed in backward.
struct Needs {
  bool a, b;
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("add", ref::BinaryOp::Add, a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "add", {a, b},
                     [need = Needs{autograd::needs_grad({a}), autograd::needs_grad({b})},
                      sa = a.shape(), sb = b.shape()](const Tensor& g) {
                       return std::vector<Tensor>{need.a ? sum_to(g, sa) : Tensor(),
                                                  need.b ? sum_to(g, sb) : Tensor()};
                     });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("sub", ref::BinaryOp::Sub, a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "sub", {a, b},
                     [need = Needs{autograd::needs_grad({a}), autograd::needs_grad({b})},
                      sa = a.shape(), sb = b.shape()](const Tensor& g) {
                       return std::vector<Tensor>{need.a ? sum_to(g, sa) : Tensor(),
                                                  need.b ? sum_to(neg(g), sb) : Tensor()};
                     });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("mul", ref::BinaryOp::Mul, a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "mul", {a, b},
                     [need = Needs{autograd::needs_grad({a}), autograd::needs_grad({b})},
                      a = a.detach(), b = b.detach()](const Tensor& g) {
                       return std::vector<Tensor>{need.a ? sum_to(mul(g, b), a.shape()) : Tensor(),
                                                  need.b ? sum_to(mul(g, a), b.shape()) : Tensor()};
                     });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("div", ref::BinaryOp::Div, a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "div", {a, b},
                     [need = Needs{autograd::needs_grad({a}), autograd::needs_grad({b})},
                      a = a.detach(), b = b.detach()](const Tensor& g) {
                       // d(a/b)/db = -a / b^2
                       Tensor ga, gb;
                       if (need.a) ga = sum_to(div(g, b), a.shape());
                       if (need.b) gb = sum_to(neg(div(mul(g, a), square(b))), b.shape());
                       return std::vector<Tensor>{ga, gb};
                     });
  }
  return out;
}

Tensor scale(const Tensor& x, float s) {
  Tensor out = unary_forward("scale", ref::UnaryOp::Scale, x, s);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "scale", {x},
                     [s](const Tensor& g) { return std::vector<Tensor>{scale(g, s)}; });
  }
  return out;
}

Tensor add_scalar(const Tensor& x, float s) {
  Tensor out = unary_forward("add_scalar", ref::UnaryOp::AddScalar, x, s);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "add_scalar", {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  }
  return out;
}

Tensor neg(const Tensor& x) {
  Tensor out = unary_forward("neg", ref::UnaryOp::Neg, x);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "neg", {x}, [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
  }
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_forward("exp", ref::UnaryOp::Exp, x);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "exp", {x}, [y = out.detach()](const Tensor& g) {
      return std::vector<Tensor>{mul(g, y)};
    });
  }
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary_forward("log", ref::UnaryOp::Log, x);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "log", {x}, [x = x.detach()](const Tensor& g) {
      return std::vector<Tensor>{div(g, x)};
    });
  }
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_forward("sqrt", ref::UnaryOp::Sqrt, x);
  if (autograd::needs_grad({x})) {
    // d sqrt(x) = 1 / (2 sqrt(x))
    autograd::record(out, "sqrt", {x}, [y = out.detach()](const Tensor& g) {
      return std::vector<Tensor>{div(scale(g, 0.5f), y)};
    });
  }
  return out;
}

Tensor square(const Tensor& x) {
  Tensor out = unary_forward("square", ref::UnaryOp::Square, x);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "square", {x}, [x = x.detach()](const Tensor& g) {
      return std::vector<Tensor>{mul(g, scale(x, 2.0f))};
    });
  }
  return out;
}

}  // namespace corelm::ops
