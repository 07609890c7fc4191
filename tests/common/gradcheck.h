// Finite-difference gradient check shared by the op tests: the gradient autograd computes for
// L(x) = sum(fn(x) * W), W a fixed random weight, must match central differences of L.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/tensor.h"

namespace corelm::testing {

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradCheckResult {
  double max_abs = 0;  // max |autograd - numeric|
  double max_rel = 0;  // max_abs / max(|numeric|, 1e-3)
};

// Weighted sum in double so the loss itself adds no rounding worth mentioning.
inline double weighted_sum(const Tensor& y, const std::vector<float>& w) {
  std::vector<float> v = y.to_float_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * w[i];
  return s;
}

// inputs: f32 tensors; only those with requires_grad() are checked. eps is the central-difference
// step (f32 arithmetic limits how small it can usefully be).
inline GradCheckResult gradcheck(const TensorFn& fn, std::vector<Tensor> inputs, double eps = 1e-3,
                                 uint64_t seed = 1234) {
  Generator gen(seed);
  Tensor y = fn(inputs);
  std::vector<float> w(static_cast<size_t>(y.numel()));
  for (float& x : w) x = gen.uniform() * 2.0f - 1.0f;
  Tensor wt = Tensor::from_vector(w, y.shape());
  for (Tensor& t : inputs) t.zero_grad();
  ops::sum(ops::mul(y, wt)).backward();

  GradCheckResult r;
  double max_numeric = 0;
  for (Tensor& x : inputs) {
    if (!x.requires_grad()) continue;
    Tensor g = x.grad();
    EXPECT_TRUE(g.defined()) << "no gradient reached an input of shape " << shape_str(x.shape());
    if (!g.defined()) continue;
    std::vector<float> analytic = g.to_float_vector();
    float* p = x.data<float>();  // inputs are contiguous leaves
    for (int64_t i = 0; i < x.numel(); ++i) {
      float orig = p[i];
      p[i] = static_cast<float>(orig + eps);
      double plus = weighted_sum(fn(inputs), w);
      p[i] = static_cast<float>(orig - eps);
      double minus = weighted_sum(fn(inputs), w);
      p[i] = orig;
      double numeric = (plus - minus) / (2 * eps);
      max_numeric = std::max(max_numeric, std::abs(numeric));
      r.max_abs = std::max(r.max_abs, std::abs(numeric - analytic[i]));
    }
  }
  r.max_rel = r.max_abs / std::max(max_numeric, 1e-3);
  return r;
}

// EXPECTs that autograd and finite differences agree within `tol` relative to the largest
// numeric gradient, and prints the errors so the test log records them.
inline void expect_gradients_match(const TensorFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-3,
                                   double tol = 2e-2) {
  GradCheckResult r = gradcheck(fn, inputs, eps);
  std::printf("[gradcheck] max_abs=%.3g max_rel=%.3g\n", r.max_abs, r.max_rel);
  EXPECT_LE(r.max_rel, tol) << "finite-difference gradient mismatch: max_abs=" << r.max_abs;
}

}  // namespace corelm::testing
