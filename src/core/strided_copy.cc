#include "strided_copy.h"

#include <cstring>
#include <vector>

namespace corelm::detail {

namespace {

// Reads element i (element units) of a buffer as double (floats) or int64 (integers).
double load_double(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::F16: return f16_to_float(static_cast<const f16*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::I8: return static_cast<const int8_t*>(base)[i];
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

int64_t load_int(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return static_cast<const int64_t*>(base)[i];
    case DType::I8: return static_cast<const int8_t*>(base)[i];
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
    default: return static_cast<int64_t>(load_double(base, dt, i));
  }
}

void store(void* base, DType dt, int64_t i, double v, int64_t iv, bool integer_src) {
  if (integer_src) v = static_cast<double>(iv);
  switch (dt) {
    case DType::F32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::BF16: static_cast<bf16*>(base)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::F16: static_cast<f16*>(base)[i] = float_to_f16(static_cast<float>(v)); break;
    // Float -> integer truncates toward zero like PyTorch's .to(int).
    case DType::I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(integer_src ? iv : static_cast<int64_t>(v)); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = integer_src ? iv : static_cast<int64_t>(v); break;
    case DType::I8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(integer_src ? iv : static_cast<int64_t>(v)); break;
    case DType::U8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(integer_src ? iv : static_cast<int64_t>(v)); break;
  }
}

}  // namespace

void strided_copy(const Shape& shape, const StridedView& src, const StridedView& dst) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return;
  const bool same = src.dtype == dst.dtype;
  const size_t es = dtype_size(src.dtype);
  const bool integer_src = !is_floating(src.dtype);
  const int64_t inner = ndim ? shape[ndim - 1] : 1;
  const int64_t s_in = ndim ? src.strides[ndim - 1] : 0;
  const int64_t d_in = ndim ? dst.strides[ndim - 1] : 0;

  std::vector<int64_t> idx(ndim > 0 ? ndim - 1 : 0, 0);
  for (int64_t done = 0; done < numel; done += inner) {
    int64_t so = 0, doff = 0;
    for (int64_t d = 0; d + 1 < ndim; ++d) {
      so += idx[d] * src.strides[d];
      doff += idx[d] * dst.strides[d];
    }
    if (same && s_in == 1 && d_in == 1) {
      std::memcpy(static_cast<char*>(dst.base) + doff * es, static_cast<const char*>(src.base) + so * es, inner * es);
    } else if (same) {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(static_cast<char*>(dst.base) + (doff + j * d_in) * es,
                    static_cast<const char*>(src.base) + (so + j * s_in) * es, es);
    } else {
      for (int64_t j = 0; j < inner; ++j) {
        int64_t si = so + j * s_in;
        if (integer_src)
          store(dst.base, dst.dtype, doff + j * d_in, 0.0, load_int(src.base, src.dtype, si), true);
        else
          store(dst.base, dst.dtype, doff + j * d_in, load_double(src.base, src.dtype, si), 0, false);
      }
    }
    for (int64_t d = ndim - 2; d >= 0; --d) {  // odometer over the outer dims
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace corelm::detail
