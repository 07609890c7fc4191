// The vectorised SwiGLU (AVX-512 paths) against the reference kernel: values and both gradients
// within float tolerance, including saturated gates and a length that is not a multiple of 16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/tensor_factories.h"
#include "corelm/isa.h"
#include "corelm/ops.h"

namespace corelm {
namespace {

struct SwigluResult {
  std::vector<float> out, grad_gate, grad_up;
};

SwigluResult swiglu_with_grads(const Tensor& gate0, const Tensor& up0, const Tensor& g) {
  Tensor gate = gate0.clone(), up = up0.clone();
  gate.set_requires_grad(true);
  up.set_requires_grad(true);
  Tensor out = ops::swiglu(gate, up);
  out.backward(g);
  return {out.to_float_vector(), gate.grad().to_float_vector(), up.grad().to_float_vector()};
}

// Relative to the largest magnitude: where d silu / d gate crosses zero (gate ~ -1.28) both
// kernels cancel, so an element-relative bound would measure the reference's rounding too.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6 * scale) << what << " element " << i;
}

TEST(SwigluFast, MatchesReferenceOnEveryPath) {
  const int64_t n = 16 * 7 + 5;
  auto gates = testing::random_tensor({n}, 1, 4.0f).to_float_vector();
  gates[0] = 0.0f;
  gates[1] = 100.0f;
  gates[2] = -100.0f;
  gates[3] = 30.0f;
  gates[4] = -30.0f;
  const Tensor gate = Tensor::from_vector(gates, {n}), up = testing::random_tensor({n}, 2),
               g = testing::random_tensor({n}, 3);
  SwigluResult want;
  {
    ScopedIsa ref(Isa::Reference);
    want = swiglu_with_grads(gate, up, g);
  }
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    const SwigluResult got = swiglu_with_grads(gate, up, g);
    expect_close(got.out, want.out, "out");
    expect_close(got.grad_gate, want.grad_gate, "grad_gate");
    expect_close(got.grad_up, want.grad_up, "grad_up");
  }
}

}  // namespace
}  // namespace corelm
