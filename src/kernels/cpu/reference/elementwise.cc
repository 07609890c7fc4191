#include "kernels/cpu/reference/elementwise.h"

#include <cmath>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {
namespace {

inline float apply(BinaryOp op, float x, float y) {
  switch (op) {
    case BinaryOp::Add: return x + y;
    case BinaryOp::Sub: return x - y;
    case BinaryOp::Mul: return x * y;
    case BinaryOp::Div: return x / y;
  }
  return 0.0f;
}

// One output row (the innermost dimension) with strided inputs; the switch sits outside the
// loop so the common contiguous case vectorises.
void binary_row(BinaryOp op, int64_t n, const float* a, int64_t sa, const float* b, int64_t sb,
                float* out) {
  switch (op) {
    case BinaryOp::Add: for (int64_t j = 0; j < n; ++j) out[j] = a[j * sa] + b[j * sb]; break;
    case BinaryOp::Sub: for (int64_t j = 0; j < n; ++j) out[j] = a[j * sa] - b[j * sb]; break;
    case BinaryOp::Mul: for (int64_t j = 0; j < n; ++j) out[j] = a[j * sa] * b[j * sb]; break;
    case BinaryOp::Div: for (int64_t j = 0; j < n; ++j) out[j] = a[j * sa] / b[j * sb]; break;
  }
}

}  // namespace

void binary(BinaryOp op, int64_t ndim, const int64_t* out_shape, const float* a,
            const int64_t* a_strides, const float* b, const int64_t* b_strides, float* out) {
  if (ndim == 0) {
    out[0] = apply(op, a[0], b[0]);
    return;
  }
  const int64_t inner = out_shape[ndim - 1];
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) rows *= out_shape[d];
  if (rows == 0 || inner == 0) return;
  const int64_t grain = inner >= 4096 ? 1 : 4096 / inner;
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      // Unravel the row index over the outer dimensions to find both input offsets.
      int64_t rem = r, off_a = 0, off_b = 0;
      for (int64_t d = ndim - 2; d >= 0; --d) {
        const int64_t i = rem % out_shape[d];
        rem /= out_shape[d];
        off_a += i * a_strides[d];
        off_b += i * b_strides[d];
      }
      binary_row(op, inner, a + off_a, a_strides[ndim - 1], b + off_b, b_strides[ndim - 1],
                 out + r * inner);
    }
  });
}

void unary(UnaryOp op, int64_t n, const float* x, float* out, float param) {
  if (n == 0) return;
  parallel_for(n, 16384, [&](int64_t begin, int64_t end) {
    switch (op) {
      case UnaryOp::Neg: for (int64_t i = begin; i < end; ++i) out[i] = -x[i]; break;
      case UnaryOp::Exp: for (int64_t i = begin; i < end; ++i) out[i] = std::exp(x[i]); break;
      case UnaryOp::Log: for (int64_t i = begin; i < end; ++i) out[i] = std::log(x[i]); break;
      case UnaryOp::Sqrt: for (int64_t i = begin; i < end; ++i) out[i] = std::sqrt(x[i]); break;
      case UnaryOp::Square: for (int64_t i = begin; i < end; ++i) out[i] = x[i] * x[i]; break;
      case UnaryOp::Scale: for (int64_t i = begin; i < end; ++i) out[i] = x[i] * param; break;
      case UnaryOp::AddScalar: for (int64_t i = begin; i < end; ++i) out[i] = x[i] + param; break;
    }
  });
}

}  // namespace corelm::kernels::reference
