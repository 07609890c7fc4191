// Argument checks shared by the op families in this folder, so every op reports a mistake the
// same way: "<op>: <what> ..." naming the shapes and dtypes involved.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "corelm/error.h"
#include "corelm/tensor.h"

namespace corelm::ops::detail {

inline void check_defined(const char* op, const Tensor& x, const char* what = "input") {
  CORELM_CHECK(x.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

inline void check_cpu(const char* op, const Tensor& x) {
  CORELM_CHECK(x.device().is_cpu(), DeviceError, op, ": only CPU tensors are supported, got ",
               x.device().str());
}

// Floating ops compute in f32; checks definedness, dtype and device.
inline void check_f32(const char* op, const Tensor& x, const char* what = "input") {
  check_defined(op, x, what);
  CORELM_CHECK(x.dtype() == DType::F32, DTypeError, op, ": ", what, " must be f32, got ",
               dtype_name(x.dtype()), " ", shape_str(x.shape()));
  check_cpu(op, x);
}

// Python-style dim (negative counts from the end) -> [0, ndim); IndexError otherwise.
inline int64_t normalize_dim(const char* op, int64_t dim, int64_t ndim, const Shape& shape) {
  CORELM_CHECK(dim >= -ndim && dim < ndim, IndexError, op, ": dim ", dim,
               " out of range for a tensor of shape ", shape_str(shape));
  return dim < 0 ? dim + ndim : dim;
}

}  // namespace corelm::ops::detail
