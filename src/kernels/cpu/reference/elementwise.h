// Reference elementwise kernels on raw f32 buffers. Binary ops read their inputs through
// per-dimension strides (0 for a broadcast dimension) and write a contiguous output.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

enum class BinaryOp { Add, Sub, Mul, Div };
enum class UnaryOp { Neg, Exp, Log, Sqrt, Square, Scale, AddScalar };

// out[idx] = a[idx . a_strides] op b[idx . b_strides] for every index idx of `out_shape`
// (row-major, `ndim` dims; ndim == 0 is a single element). Strides are in elements.
void binary(BinaryOp op, int64_t ndim, const int64_t* out_shape, const float* a,
            const int64_t* a_strides, const float* b, const int64_t* b_strides, float* out);

// out[i] = f(x[i]) for i < n; `param` is the factor of Scale and the addend of AddScalar.
void unary(UnaryOp op, int64_t n, const float* x, float* out, float param = 0.0f);

}  // namespace corelm::kernels::reference
