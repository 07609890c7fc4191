// Tensor: a view (shape, strides in elements, offset in elements, dtype) over a shared Storage.
// Methods here are raw, non-differentiable tensor mechanics; the differentiable versions of
// view-like ops (reshape, transpose, ...) live in corelm/ops.h and record on the autograd graph.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "corelm/dtype.h"
#include "corelm/error.h"
#include "corelm/storage.h"

namespace corelm {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

std::string shape_str(const Shape& s);        // "[2, 3]"
int64_t shape_numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
// PyTorch broadcasting of two shapes; throws ShapeError naming both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b);

namespace autograd { struct Node; }
class Generator;

// Per-tensor autograd state. Only tensors that take part in differentiation carry one.
struct AutogradMeta;

class Tensor {
 public:
  Tensor() = default;  // undefined tensor; defined() is false

  // --- factories (contiguous, CPU unless a device is given) ---
  // empty(): UNINITIALIZED memory (recycled by the caching allocator, src/core/allocator.h); the
  // caller writes every element. Use zeros() when zeros are needed. CORELM_ALLOC_POISON=1 fills
  // new buffers with NaN bytes so a read of unwritten memory shows in tests.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape);
  static Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape);
  static Tensor arange(int64_t n, DType dtype = DType::F32);
  static Tensor randn(const Shape& shape, Generator& gen, float stddev = 1.0f);
  static Tensor rand(const Shape& shape, Generator& gen, float low = 0.0f, float high = 1.0f);
  // A view over an existing storage (used by loaders that mmap files).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                             int64_t offset = 0, Strides strides = {});

  // --- metadata ---
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Strides& strides() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;   // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const;
  std::string str() const;  // "Tensor(f32, [2, 3])"

  // --- element access (pointer to element 0 of the view; checks dtype) ---
  template <typename T> T* data() const;
  void* raw_data() const;
  double item() const;                       // single-element tensors, any dtype
  std::vector<float> to_float_vector() const;  // any float/int dtype, logical (row-major) order
  std::vector<int64_t> to_int_vector() const;

  // --- raw views (share storage, no autograd) ---
  Tensor view(const Shape& shape) const;     // contiguous input only; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view if possible, else copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // python-style negatives
  Tensor select(int64_t dim, int64_t index) const;  // drops dim
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;  // broadcast view (stride 0)

  // --- copies ---
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;  // conversion (bf16/f16 round-to-nearest-even); self if same
  void copy_(const Tensor& src);  // elementwise copy with broadcasting and dtype conversion
  void fill_(double value);

  // --- autograd ---
  bool requires_grad() const;
  Tensor& set_requires_grad(bool value);  // leaves only: float dtypes
  Tensor grad() const;                    // undefined until a backward reaches this leaf
  void set_grad(const Tensor& g);
  void zero_grad();                       // drops the accumulated gradient
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  void set_grad_fn(std::shared_ptr<autograd::Node> fn);  // used by ops when recording
  bool is_leaf() const { return grad_fn() == nullptr; }
  Tensor detach() const;  // same data, no autograd history
  // Reverse-mode differentiation from this tensor; a scalar unless `grad` is given.
  void backward(const Tensor& grad = Tensor()) const;

  // Identity of the underlying TensorImpl (autograd uses it to accumulate gradients).
  const void* id() const { return impl_.get(); }

 private:
  struct Impl;
  explicit Tensor(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl& impl() const;
  std::shared_ptr<Impl> impl_;
};

template <typename T>
T* Tensor::data() const {
  CORELM_CHECK(defined(), ValueError, "data() on an undefined tensor");
  CORELM_CHECK(dtype() == dtype_of<T>(), DTypeError, "data<", dtype_name(dtype_of<T>()), ">() on a ",
               dtype_name(dtype()), " tensor ", shape_str(shape()));
  return static_cast<T*>(raw_data());
}

}  // namespace corelm
