// Row primitives for the fast training kernels (softmax, cross-entropy, attention): max, exp with a
// shift, scaling. Each call picks the AVX-512 version (avx512/train_vec.cc) when active_isa() >=
// Avx512, else a portable loop. Within one path every reduction runs in a fixed order that depends
// only on n, so a row's result never depends on the thread count or on the other rows.
// exp is a polynomial on the AVX-512 path (max relative error ~2e-7 in float) and std::exp in the
// portable loop; sums accumulate in double on both.
#pragma once
#include <cstdint>

namespace corelm::kernels::fast {

float row_max(const float* x, int64_t n);
// y[i] = exp(x[i] - shift); returns the sum of the y[i]. y may alias x.
double exp_shift_sum(const float* x, float* y, int64_t n, float shift);
// y[i] = exp(x[i] - shift) * scale. y may alias x.
void exp_shift_scale(const float* x, float* y, int64_t n, float shift, float scale);
// x[i] *= scale.
void scale_inplace(float* x, int64_t n, float scale);
// sum of a[i] * b[i] (double accumulation).
double dot(const float* a, const float* b, int64_t n);
// ds[i] = p[i] * (dp[i] - centre) * scale: the softmax backward of one row. ds may alias dp.
void softmax_backward_row(const float* p, const float* dp, float* ds, int64_t n, float centre, float scale);

// SwiGLU, y = silu(gate) * up, and its backward, elementwise over n values (split over the pool);
// the reference kernels on paths below Avx512.
void swiglu_forward(const float* gate, const float* up, float* y, int64_t n);
void swiglu_backward(const float* gate, const float* up, const float* grad_y, float* grad_gate, float* grad_up,
                     int64_t n);

// One AdamW step over n parameters (the update of optim::AdamW, in this order):
//   w *= decay;  m = m * beta1 + one_minus_b1 * g;  v = v * beta2 + (one_minus_b2 * g) * g;
//   w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps))
// Every operation is a separately rounded IEEE multiply, add, divide or square root (no FMA), so
// all paths give the same bits and training results do not depend on the CPU. Split over the pool.
struct AdamWScalars {
  float decay = 1, beta1 = 0, one_minus_b1 = 1, beta2 = 0, one_minus_b2 = 1, bc2_sqrt = 1, eps = 0, step_size = 0;
};
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);
// The portable loop of adamw_update (the contract the AVX-512 version is tested against).
void adamw_update_portable(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

}  // namespace corelm::kernels::fast

// The AVX-512 implementations (compiled with AVX-512 flags; call only when active_isa() >= Avx512).
namespace corelm::kernels::avx512 {

float train_row_max(const float* x, int64_t n);
double train_exp_shift_sum(const float* x, float* y, int64_t n, float shift);
void train_exp_shift_scale(const float* x, float* y, int64_t n, float shift, float scale);
void train_scale_inplace(float* x, int64_t n, float scale);
double train_dot(const float* a, const float* b, int64_t n);
void train_softmax_backward_row(const float* p, const float* dp, float* ds, int64_t n, float centre, float scale);
void train_swiglu_forward(const float* gate, const float* up, float* y, int64_t n);
void train_swiglu_backward(const float* gate, const float* up, const float* grad_y, float* grad_gate, float* grad_up,
                           int64_t n);
void train_adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const fast::AdamWScalars& s);

}  // namespace corelm::kernels::avx512
