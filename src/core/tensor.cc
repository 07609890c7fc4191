#include "corelm/tensor.h"

#include <algorithm>
#include <sstream>

#include "corelm/out_of_memory.h"
#include "corelm/random.h"
#include "strided_copy.h"
#include "tensor_impl.h"

namespace corelm {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    CORELM_CHECK(da == db || da == 1 || db == 1, ShapeError, "shapes ", shape_str(a), " and ", shape_str(b),
                 " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {
int64_t wrap_dim(int64_t d, int64_t ndim, const char* what) {
  int64_t w = d < 0 ? d + ndim : d;
  CORELM_CHECK(w >= 0 && w < ndim, IndexError, what, ": dim ", d, " out of range for a ", ndim, "-d tensor");
  return w;
}
void check_shape(const Shape& shape) {
  for (int64_t d : shape) CORELM_CHECK(d >= 0, ShapeError, "negative dimension in shape ", shape_str(shape));
}
// The tensor's storage; an allocation that fails names the tensor ("... for f32 tensor [...]").
std::shared_ptr<Storage> tensor_storage(const Shape& shape, DType dtype, Device device, bool zero) {
  // Checked: a product of dimensions that wraps would allocate a small buffer for a huge shape.
  size_t nbytes = dtype_size(dtype);
  for (int64_t d : shape)
    CORELM_CHECK(!__builtin_mul_overflow(nbytes, static_cast<size_t>(d), &nbytes), ShapeError, dtype_name(dtype),
                 " tensor ", shape_str(shape), " has more bytes than memory can address");
  try {
    return zero ? Storage::allocate(nbytes, device) : Storage::allocate_uninitialized(nbytes, device);
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(e.bytes(), std::string(dtype_name(dtype)) + " tensor " + shape_str(shape));
  }
}
}  // namespace

// ---------------------------------------------------------------- factories

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  auto impl = std::make_shared<Impl>();
  impl->storage = tensor_storage(shape, dtype, device, false);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  auto impl = std::make_shared<Impl>();
  impl->storage = tensor_storage(shape, dtype, device, true);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill_(value);
  return t;
}

namespace {
template <typename T>
Tensor tensor_from(const std::vector<T>& values, const Shape& shape) {
  CORELM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), ShapeError, "from_vector: ",
               values.size(), " values do not fill shape ", shape_str(shape));
  Tensor t = Tensor::empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}
}  // namespace

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& s) { return tensor_from(v, s); }
Tensor Tensor::from_vector(const std::vector<int64_t>& v, const Shape& s) { return tensor_from(v, s); }
Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& s) { return tensor_from(v, s); }

Tensor Tensor::arange(int64_t n, DType dtype) {
  Tensor t = empty({n}, DType::I64);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i;
  return t.to(dtype);
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, float stddev) {
  Tensor t = empty(shape, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = gen.normal() * stddev;
  return t;
}

Tensor Tensor::rand(const Shape& shape, Generator& gen, float low, float high) {
  Tensor t = empty(shape, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = low + (high - low) * gen.uniform();
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype, int64_t offset,
                            Strides strides) {
  check_shape(shape);
  if (strides.empty()) strides = contiguous_strides(shape);
  CORELM_CHECK(strides.size() == shape.size(), ShapeError, "from_storage: ", strides.size(),
               " strides for shape ", shape_str(shape));
  // The furthest element the view can reach must lie inside the storage.
  int64_t last = offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    CORELM_CHECK(strides[i] >= 0, ShapeError, "from_storage: negative stride in view ", shape_str(shape));
    last += (shape[i] - 1) * strides[i];
  }
  CORELM_CHECK(offset >= 0 && (shape_numel(shape) == 0 ||
                               static_cast<size_t>(last + 1) * dtype_size(dtype) <= storage->nbytes()),
               IndexError, "from_storage: view ", shape_str(shape), " ", dtype_name(dtype), " at offset ", offset,
               " exceeds a storage of ", storage->nbytes(), " bytes");
  auto impl = std::make_shared<Impl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// ---------------------------------------------------------------- metadata

Tensor::Impl& Tensor::impl() const {
  CORELM_CHECK(impl_ != nullptr, ValueError, "use of an undefined tensor");
  return *impl_;
}

const Shape& Tensor::shape() const { return impl().shape; }
const Strides& Tensor::strides() const { return impl().strides; }
int64_t Tensor::offset() const { return impl().offset; }
DType Tensor::dtype() const { return impl().dtype; }
Device Tensor::device() const { return impl().storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { return impl().storage; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  const Shape& s = shape();
  const Strides& st = strides();
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (s[i] != 1 && st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return std::string("Tensor(") + dtype_name(dtype()) + ", " + shape_str(shape()) + ")";
}

void* Tensor::raw_data() const {
  auto& im = impl();
  return static_cast<char*>(im.storage->data()) + im.offset * static_cast<int64_t>(dtype_size(im.dtype));
}

double Tensor::item() const {
  CORELM_CHECK(numel() == 1, ShapeError, "item() needs exactly one element, tensor has shape ", shape_str(shape()));
  if (!is_floating(dtype())) return static_cast<double>(to_int_vector()[0]);
  return to_float_vector()[0];
}

std::vector<float> Tensor::to_float_vector() const {
  Tensor c = to(DType::F32).contiguous();
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

std::vector<int64_t> Tensor::to_int_vector() const {
  Tensor c = to(DType::I64).contiguous();
  const int64_t* p = c.data<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// ---------------------------------------------------------------- views

namespace {
Tensor make_view(const std::shared_ptr<Storage>& storage, Shape shape, Strides strides, int64_t offset, DType dt);
}

Tensor Tensor::view(const Shape& new_shape) const {
  Shape s = new_shape;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      CORELM_CHECK(infer < 0, ShapeError, "view: only one dimension can be -1 in ", shape_str(new_shape));
      infer = static_cast<int64_t>(i);
    } else {
      CORELM_CHECK(s[i] >= 0, ShapeError, "view: invalid shape ", shape_str(new_shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    CORELM_CHECK(known != 0 && numel() % known == 0, ShapeError, "view: shape ", shape_str(new_shape),
                 " is invalid for a tensor of shape ", shape_str(shape()));
    s[infer] = numel() / known;
  }
  CORELM_CHECK(shape_numel(s) == numel(), ShapeError, "view: shape ", shape_str(new_shape),
               " is invalid for a tensor of shape ", shape_str(shape()), " (", numel(), " elements)");
  CORELM_CHECK(is_contiguous(), ShapeError, "view: tensor of shape ", shape_str(shape()),
               " is not contiguous; use reshape() (which copies)");
  return make_view(storage(), s, contiguous_strides(s), offset(), dtype());
}

Tensor Tensor::reshape(const Shape& s) const { return is_contiguous() ? view(s) : contiguous().view(s); }

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> perm(dim());
  for (int64_t i = 0; i < dim(); ++i) perm[i] = i;
  std::swap(perm[wrap_dim(d0, dim(), "transpose")], perm[wrap_dim(d1, dim(), "transpose")]);
  return permute(perm);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  CORELM_CHECK(static_cast<int64_t>(dims.size()) == dim(), ShapeError, "permute: ", dims.size(),
               " dims given for a ", dim(), "-d tensor ", shape_str(shape()));
  Shape s(dim());
  Strides st(dim());
  std::vector<bool> seen(dim(), false);
  for (int64_t i = 0; i < dim(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    CORELM_CHECK(!seen[d], ShapeError, "permute: dim ", d, " repeated");
    seen[d] = true;
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  return make_view(storage(), s, st, offset(), dtype());
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  CORELM_CHECK(step > 0, ValueError, "slice: step must be positive, got ", step);
  int64_t n = shape()[d];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape s = shape();
  Strides st = strides();
  s[d] = (end - start + step - 1) / step;
  st[d] = strides()[d] * step;
  return make_view(storage(), s, st, offset() + start * strides()[d], dtype());
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape()[d];
  CORELM_CHECK(index >= -n && index < n, IndexError, "select: index ", index, " out of range for dim ", d,
               " of size ", n, " in ", shape_str(shape()));
  if (index < 0) index += n;
  Shape s = shape();
  Strides st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(storage(), s, st, offset() + index * strides()[d], dtype());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape();
  Strides st = strides();
  int64_t stride = d < dim() ? strides()[d] * shape()[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return make_view(storage(), s, st, offset(), dtype());
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  CORELM_CHECK(shape()[d] == 1, ShapeError, "squeeze: dim ", d, " has size ", shape()[d], ", not 1, in ",
               shape_str(shape()));
  Shape s = shape();
  Strides st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(storage(), s, st, offset(), dtype());
}

Tensor Tensor::expand(const Shape& target) const {
  CORELM_CHECK(target.size() >= shape().size(), ShapeError, "expand: cannot expand ", shape_str(shape()), " to ",
               shape_str(target));
  size_t lead = target.size() - shape().size();
  Shape s(target.size());
  Strides st(target.size(), 0);
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      CORELM_CHECK(target[i] >= 0, ShapeError, "expand: -1 not allowed for new leading dim in ", shape_str(target));
      s[i] = target[i];
      continue;
    }
    int64_t cur = shape()[i - lead];
    int64_t want = target[i] == -1 ? cur : target[i];
    CORELM_CHECK(cur == want || cur == 1, ShapeError, "expand: cannot expand ", shape_str(shape()), " to ",
                 shape_str(target), " (dim ", i, ")");
    s[i] = want;
    st[i] = cur == want ? strides()[i - lead] : 0;
  }
  return make_view(storage(), s, st, offset(), dtype());
}

// ---------------------------------------------------------------- copies

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = empty(shape(), dt, device());
  out.copy_(*this);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  CORELM_CHECK(device() == src.device(), DeviceError, "copy_: source on ", src.device().str(), ", destination on ",
               device().str());
  Tensor s = src.shape() == shape() ? src : src.expand(shape());
  detail::strided_copy(shape(), {s.raw_data(), s.dtype(), s.strides().data()},
                       {raw_data(), dtype(), strides().data()});
}

void Tensor::fill_(double value) {
  Tensor one = empty({}, DType::F32);
  if (is_floating(dtype())) {
    one.data<float>()[0] = static_cast<float>(value);
  } else {
    one = empty({}, DType::I64);
    one.data<int64_t>()[0] = static_cast<int64_t>(value);
  }
  copy_(one);
}

// ---------------------------------------------------------------- autograd state

bool Tensor::requires_grad() const {
  auto& im = impl();
  return im.autograd && (im.autograd->requires_grad || im.autograd->grad_fn);
}

Tensor& Tensor::set_requires_grad(bool value) {
  CORELM_CHECK(!value || is_floating(dtype()), AutogradError, "requires_grad needs a floating dtype, tensor is ",
               dtype_name(dtype()), " ", shape_str(shape()));
  CORELM_CHECK(is_leaf(), AutogradError, "set_requires_grad on a non-leaf tensor; use detach() first");
  impl().meta().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  auto& im = impl();
  return im.autograd ? im.autograd->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined())
    CORELM_CHECK(g.shape() == shape(), ShapeError, "set_grad: gradient ", shape_str(g.shape()),
                 " does not match tensor ", shape_str(shape()));
  impl().meta().grad = g;
}

void Tensor::zero_grad() {
  if (impl().autograd) impl().autograd->grad = Tensor();
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  auto& im = impl();
  return im.autograd ? im.autograd->grad_fn : none;
}

void Tensor::set_grad_fn(std::shared_ptr<autograd::Node> fn) { impl().meta().grad_fn = std::move(fn); }

Tensor Tensor::detach() const {
  return make_view(storage(), shape(), strides(), offset(), dtype());
}

namespace {
Tensor make_view(const std::shared_ptr<Storage>& storage, Shape shape, Strides strides, int64_t offset, DType dt) {
  return Tensor::from_storage(storage, shape, dt, offset, std::move(strides));
}
}  // namespace

}  // namespace corelm
