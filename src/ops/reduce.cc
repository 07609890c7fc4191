// Sum and mean over a set of dims (or all elements). The input is arranged as
// [outer, reduce, inner] for the kernel: directly when the reduced dims are adjacent, otherwise
// after a permute that moves them last. An empty dim list reduces nothing (a copy).
#include <algorithm>

#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "kernels/cpu/reference/elementwise.h"
#include "kernels/cpu/reference/reduce.h"
#include "ops/op_checks.h"

namespace corelm::ops {
namespace {
namespace ref = kernels::reference;

// Sorted, unique, non-negative dims; IndexError / ValueError on bad ones.
std::vector<int64_t> normalize_dims(const char* op, const Tensor& x,
                                    const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  for (int64_t d : dims) {
    const int64_t n = detail::normalize_dim(op, d, x.dim(), x.shape());
    CORELM_CHECK(std::find(out.begin(), out.end(), n) == out.end(), ValueError, op, ": dim ", d,
                 " repeated in ", shape_str(dims), " for shape ", shape_str(x.shape()));
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    if (!reduced) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// Forward only: no recording.
Tensor sum_forward(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = Tensor::empty(reduced_shape(x.shape(), dims, keepdim));
  if (dims.empty()) {
    out.copy_(x);
    return out;
  }
  const bool adjacent = dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  Tensor src = x;
  int64_t first = dims.front(), last = dims.back();
  if (!adjacent) {
    std::vector<int64_t> order;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (!std::binary_search(dims.begin(), dims.end(), d)) order.push_back(d);
    order.insert(order.end(), dims.begin(), dims.end());
    src = x.permute(order);
    first = x.dim() - static_cast<int64_t>(dims.size());
    last = x.dim() - 1;
  }
  src = src.contiguous();
  int64_t outer = 1, reduce = 1, inner = 1;
  for (int64_t d = 0; d < src.dim(); ++d) {
    if (d < first) outer *= src.size(d);
    else if (d <= last) reduce *= src.size(d);
    else inner *= src.size(d);
  }
  ref::sum_middle(outer, reduce, inner, src.data<float>(), out.data<float>());
  return out;
}

// Broadcasts the gradient of a reduction back over the input shape, times `factor`.
Tensor expand_grad(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& dims,
                   float factor) {
  Tensor gk = g.reshape(reduced_shape(in_shape, dims, /*keepdim=*/true));
  Tensor out = gk.expand(in_shape).contiguous();
  return factor == 1.0f ? out : scale(out, factor);
}

Tensor reduce(const char* name, const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim,
              bool is_mean) {
  detail::check_f32(name, x);
  const std::vector<int64_t> dims = normalize_dims(name, x, dims_in);
  int64_t count = 1;
  for (int64_t d : dims) count *= x.size(d);
  Tensor out = sum_forward(x, dims, keepdim);
  // Mean of an empty set is NaN, as in torch.
  const float factor = is_mean ? 1.0f / static_cast<float>(count) : 1.0f;
  if (is_mean) {
    float* p = out.data<float>();
    kernels::reference::unary(kernels::reference::UnaryOp::Scale, out.numel(), p, p, factor);
  }
  if (autograd::needs_grad({x})) {
    autograd::record(out, name, {x}, [in_shape = x.shape(), dims, factor](const Tensor& g) {
      return std::vector<Tensor>{expand_grad(g, in_shape, dims, factor)};
    });
  }
  return out;
}

std::vector<int64_t> all_dims(const Tensor& x) {
  std::vector<int64_t> dims(static_cast<size_t>(x.defined() ? x.dim() : 0));
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
  return dims;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("sum", x, dims, keepdim, /*is_mean=*/false);
}

Tensor sum(const Tensor& x) { return reduce("sum", x, all_dims(x), false, false); }

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("mean", x, dims, keepdim, /*is_mean=*/true);
}

Tensor mean(const Tensor& x) { return reduce("mean", x, all_dims(x), false, true); }

}  // namespace corelm::ops
