// The fast RMSNorm (every non-reference ISA path) against the reference kernel: output and both
// gradients within float tolerance, and rows that do not depend on the other rows or the threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/tensor_factories.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

struct NormResult {
  std::vector<float> out, grad_x, grad_w;
};

NormResult rms_norm_with_grads(const Tensor& x0, const Tensor& w0, const Tensor& g) {
  Tensor x = x0.clone(), w = w0.clone();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor out = ops::rms_norm(x, w, 1e-5f);
  out.backward(g);
  return {out.to_float_vector(), x.grad().to_float_vector(), w.grad().to_float_vector()};
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6 * scale) << what << " element " << i;
}

TEST(RmsNormFast, MatchesReferenceOnEveryPathAndIsRowInvariant) {
  const int64_t rows = 37, d = 83;  // d: a 16-lane tail
  const Tensor x = testing::random_tensor({rows, d}, 1, 3.0f), w = testing::random_tensor({d}, 2),
               g = testing::random_tensor({rows, d}, 3);
  NormResult want;
  {
    ScopedIsa ref(Isa::Reference);
    want = rms_norm_with_grads(x, w, g);
  }
  for (Isa isa : supported_isas()) {
    if (isa == Isa::Reference) continue;
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    const NormResult got = rms_norm_with_grads(x, w, g);
    expect_close(got.out, want.out, "out");
    expect_close(got.grad_x, want.grad_x, "grad_x");
    expect_close(got.grad_w, want.grad_w, "grad_w");
    set_num_threads(2);
    const NormResult threaded = rms_norm_with_grads(x, w, g);
    set_num_threads(1);
    EXPECT_EQ(threaded.out, got.out);
    EXPECT_EQ(threaded.grad_x, got.grad_x);
    EXPECT_EQ(threaded.grad_w, got.grad_w);
    // Row 5 alone: the same output and input gradient bits as in the batch.
    const NormResult alone = rms_norm_with_grads(x.slice(0, 5, 6).contiguous(), w, g.slice(0, 5, 6).contiguous());
    EXPECT_EQ(alone.out, std::vector<float>(got.out.begin() + 5 * d, got.out.begin() + 6 * d));
    EXPECT_EQ(alone.grad_x, std::vector<float>(got.grad_x.begin() + 5 * d, got.grad_x.begin() + 6 * d));
  }
}

}  // namespace
}  // namespace corelm
