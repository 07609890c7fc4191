// The private state behind a Tensor handle; shared by src/core and src/autograd only.
#pragma once
#include <memory>

#include "corelm/tensor.h"

namespace corelm {

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;
};

struct Tensor::Impl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;
  int64_t offset = 0;
  DType dtype = DType::F32;
  std::unique_ptr<AutogradMeta> autograd;  // null for tensors that never took part in autograd

  AutogradMeta& meta() {
    if (!autograd) autograd = std::make_unique<AutogradMeta>();
    return *autograd;
  }
};

}  // namespace corelm
