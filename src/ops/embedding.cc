// Embedding lookup: gathers rows of weight [V, D] by integer ids. The backward scatter-adds the
// output gradient into a zero [V, D] tensor in id order, so repeated ids sum deterministically.
#include <memory>

#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "kernels/cpu/reference/embedding.h"
#include "ops/op_checks.h"

namespace corelm::ops {

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  detail::check_f32("embedding", weight, "weight");
  detail::check_defined("embedding", ids, "ids");
  detail::check_cpu("embedding", ids);
  CORELM_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, DTypeError,
               "embedding: ids must be i32 or i64, got ", dtype_name(ids.dtype()), " ",
               shape_str(ids.shape()));
  CORELM_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be [V, D], got ",
               shape_str(weight.shape()));
  const int64_t V = weight.size(0), D = weight.size(1);
  auto flat_ids = std::make_shared<std::vector<int64_t>>(ids.to_int_vector());
  for (int64_t id : *flat_ids)
    CORELM_CHECK(id >= 0 && id < V, IndexError, "embedding: id ", id, " out of range for V = ", V,
                 " (weight ", shape_str(weight.shape()), ")");

  Shape out_shape = ids.shape();
  out_shape.push_back(D);
  Tensor out = Tensor::empty(out_shape);
  const Tensor wc = weight.contiguous();
  const int64_t n = static_cast<int64_t>(flat_ids->size());
  kernels::reference::embedding_forward(wc.data<float>(), D, flat_ids->data(), n, out.data<float>());

  if (autograd::needs_grad({weight})) {
    autograd::record(out, "embedding", {weight, ids}, [flat_ids, V, D](const Tensor& g) {
      Tensor gw = Tensor::zeros({V, D});
      const Tensor gc = g.contiguous();
      kernels::reference::embedding_backward(gc.data<float>(), D, flat_ids->data(),
                                             static_cast<int64_t>(flat_ids->size()),
                                             gw.data<float>());
      return std::vector<Tensor>{gw, Tensor()};
    });
  }
  return out;
}

}  // namespace corelm::ops
