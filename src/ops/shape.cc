// Differentiable views and shape ops: thin wrappers over the raw Tensor views that add argument
// checks with op-named errors and record the backward (the inverse view, or a scatter into
// zeros for slice, or a split for concat).
#include <algorithm>
#include <numeric>

#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "ops/op_checks.h"

namespace corelm::ops {
using detail::check_defined;
using detail::normalize_dim;

namespace {

// Resolves a single -1 and checks the element count; the raw view does the rest.
Shape resolve_reshape(const Tensor& x, const Shape& shape) {
  Shape out = shape;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      CORELM_CHECK(infer_at < 0, ShapeError, "reshape: more than one -1 in ", shape_str(shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      CORELM_CHECK(out[i] >= 0, ShapeError, "reshape: negative size in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    CORELM_CHECK(known != 0 && x.numel() % known == 0, ShapeError, "reshape: cannot view ",
                 shape_str(x.shape()), " as ", shape_str(shape));
    out[infer_at] = x.numel() / known;
  }
  CORELM_CHECK(shape_numel(out) == x.numel(), ShapeError, "reshape: cannot view ",
               shape_str(x.shape()), " (", x.numel(), " elements) as ", shape_str(shape));
  return out;
}

// A view that came back as the very same tensor (e.g. an identity reshape) must not get a
// grad_fn of its own: that would overwrite the input's place in the graph.
bool same_tensor(const Tensor& a, const Tensor& b) { return a.id() == b.id(); }

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined("reshape", x);
  Tensor out = x.reshape(resolve_reshape(x, shape));
  if (!same_tensor(out, x) && autograd::needs_grad({x})) {
    autograd::record(out, "reshape", {x}, [in_shape = x.shape()](const Tensor& g) {
      return std::vector<Tensor>{g.reshape(in_shape)};
    });
  }
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  check_defined("transpose", x);
  d0 = normalize_dim("transpose", d0, x.dim(), x.shape());
  d1 = normalize_dim("transpose", d1, x.dim(), x.shape());
  Tensor out = x.transpose(d0, d1);
  if (!same_tensor(out, x) && autograd::needs_grad({x})) {
    autograd::record(out, "transpose", {x}, [d0, d1](const Tensor& g) {
      return std::vector<Tensor>{g.transpose(d0, d1)};
    });
  }
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined("permute", x);
  const int64_t n = x.dim();
  CORELM_CHECK(static_cast<int64_t>(dims.size()) == n, ShapeError, "permute: ", dims.size(),
               " dims given for a tensor of shape ", shape_str(x.shape()));
  std::vector<int64_t> norm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    norm[i] = normalize_dim("permute", dims[i], n, x.shape());
    CORELM_CHECK(!seen[norm[i]], ValueError, "permute: dim ", dims[i], " repeated in ",
                 shape_str(dims));
    seen[norm[i]] = true;
  }
  Tensor out = x.permute(norm);
  if (!same_tensor(out, x) && autograd::needs_grad({x})) {
    std::vector<int64_t> inverse(norm.size());
    for (size_t i = 0; i < norm.size(); ++i) inverse[norm[i]] = static_cast<int64_t>(i);
    autograd::record(out, "permute", {x}, [inverse](const Tensor& g) {
      return std::vector<Tensor>{g.permute(inverse)};
    });
  }
  return out;
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  check_defined("slice", x);
  dim = normalize_dim("slice", dim, x.dim(), x.shape());
  CORELM_CHECK(step > 0, ValueError, "slice: step must be positive, got ", step);
  Tensor out = x.slice(dim, start, end, step);
  if (!same_tensor(out, x) && autograd::needs_grad({x})) {
    autograd::record(out, "slice", {x},
                     [in_shape = x.shape(), dim, start, end, step](const Tensor& g) {
                       Tensor gx = Tensor::zeros(in_shape, g.dtype());
                       gx.slice(dim, start, end, step).copy_(g);
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

Tensor contiguous(const Tensor& x) {
  check_defined("contiguous", x);
  // Already contiguous: the tensor itself, like torch; the graph needs no extra node.
  if (x.is_contiguous()) return x;
  Tensor out = x.contiguous();
  if (autograd::needs_grad({x})) {
    autograd::record(out, "contiguous", {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  }
  return out;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  CORELM_CHECK(!xs.empty(), ValueError, "concat: no tensors given");
  for (const Tensor& x : xs) check_defined("concat", x);
  const Tensor& first = xs.front();
  const int64_t n = first.dim();
  CORELM_CHECK(n > 0, ShapeError, "concat: cannot concatenate 0-dim tensors");
  dim = normalize_dim("concat", dim, n, first.shape());
  Shape out_shape = first.shape();
  out_shape[dim] = 0;
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) {
    CORELM_CHECK(x.dtype() == first.dtype(), DTypeError, "concat: dtypes differ: ",
                 dtype_name(first.dtype()), " vs ", dtype_name(x.dtype()));
    CORELM_CHECK(x.device() == first.device(), DeviceError, "concat: devices differ: ",
                 first.device().str(), " vs ", x.device().str());
    bool compatible = x.dim() == n;
    for (int64_t d = 0; compatible && d < n; ++d)
      compatible = d == dim || x.size(d) == first.size(d);
    CORELM_CHECK(compatible, ShapeError, "concat: shapes ", shape_str(first.shape()), " and ",
                 shape_str(x.shape()), " differ outside dim ", dim);
    sizes.push_back(x.size(dim));
    out_shape[dim] += x.size(dim);
  }
  Tensor out = Tensor::empty(out_shape, first.dtype(), first.device());
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    out.slice(dim, offset, offset + sizes[i]).copy_(xs[i]);
    offset += sizes[i];
  }
  if (autograd::needs_grad(xs)) {
    autograd::record(out, "concat", xs, [dim, sizes](const Tensor& g) {
      std::vector<Tensor> grads;
      int64_t off = 0;
      for (int64_t s : sizes) {
        grads.push_back(g.slice(dim, off, off + s).contiguous());
        off += s;
      }
      return grads;
    });
  }
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  check_defined("sum_to", g);
  if (g.shape() == shape) return g;
  const int64_t gd = g.dim(), sd = static_cast<int64_t>(shape.size());
  auto mismatch = [&] {
    return ::corelm::detail::concat("sum_to: cannot reduce ", shape_str(g.shape()), " to ", shape_str(shape));
  };
  CORELM_CHECK(sd <= gd, ShapeError, mismatch());
  // Leading dims that broadcasting added, plus dims that were broadcast from size 1.
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < gd - sd; ++d) dims.push_back(d);
  for (int64_t d = 0; d < sd; ++d) {
    const int64_t gsize = g.size(gd - sd + d);
    CORELM_CHECK(shape[d] == gsize || shape[d] == 1, ShapeError, mismatch());
    if (shape[d] == 1 && gsize != 1) dims.push_back(gd - sd + d);
  }
  if (dims.empty()) return reshape(g, shape);
  return reshape(sum(g, dims, /*keepdim=*/true), shape);
}

}  // namespace corelm::ops
