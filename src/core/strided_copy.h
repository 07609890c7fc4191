// Elementwise copy between two strided views of the same shape, converting dtypes when they
// differ. The workhorse behind contiguous(), clone(), to() and copy_().
#pragma once
#include <cstdint>

#include "corelm/dtype.h"
#include "corelm/tensor.h"

namespace corelm::detail {

struct StridedView {
  void* base;         // element 0 of the view
  DType dtype;
  const int64_t* strides;  // in elements
};

void strided_copy(const Shape& shape, const StridedView& src, const StridedView& dst);

}  // namespace corelm::detail
