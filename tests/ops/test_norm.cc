// RMSNorm: values against a double-precision loop, gradients, thread invariance, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/tensor.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::leaf;
using testing::random_tensor;

std::vector<double> naive_rms_norm(const std::vector<float>& x, const std::vector<float>& w, float eps) {
  const size_t d = w.size();
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    double ms = 0.0;
    for (size_t j = 0; j < d; ++j) ms += double(x[r * d + j]) * x[r * d + j];
    const double inv = 1.0 / std::sqrt(ms / d + eps);
    for (size_t j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] * inv * w[j];
  }
  return y;
}

TEST(RmsNormOp, MatchesNaive) {
  Tensor x = random_tensor({2, 3, 8}, 1, 2.0f), w = random_tensor({8}, 2);
  auto want = naive_rms_norm(x.to_float_vector(), w.to_float_vector(), 1e-6f);
  Tensor y = ops::rms_norm(x, w, 1e-6f);
  EXPECT_EQ(y.shape(), x.shape());
  auto got = y.to_float_vector();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i])));
}

TEST(RmsNormOp, UnitWeightGivesUnitRms) {
  Tensor x = random_tensor({4, 16}, 3, 5.0f);
  auto y = ops::rms_norm(x, Tensor::ones({16}), 0.0f).to_float_vector();
  for (int r = 0; r < 4; ++r) {
    double ms = 0.0;
    for (int j = 0; j < 16; ++j) ms += double(y[r * 16 + j]) * y[r * 16 + j];
    EXPECT_NEAR(ms / 16, 1.0, 1e-5);
  }
}

TEST(RmsNormOp, EpsDominatesForZeroRow) {
  auto y = ops::rms_norm(Tensor::zeros({1, 4}), Tensor::ones({4}), 1e-5f).to_float_vector();
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(RmsNormOp, NonContiguousInput) {
  Tensor x = random_tensor({8, 3}, 4).transpose(0, 1);  // [3, 8], last dim strided
  Tensor w = random_tensor({8}, 5);
  EXPECT_EQ(ops::rms_norm(x, w, 1e-5f).to_float_vector(),
            ops::rms_norm(x.contiguous(), w, 1e-5f).to_float_vector());
}

TEST(RmsNormOp, Gradient) {
  Tensor x = random_tensor({2, 3, 6}, 6), w = random_tensor({6}, 7);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1], 1e-5f); }, {leaf(x), leaf(w)});
}

TEST(RmsNormOp, BackwardThreadCountInvariant) {
  Tensor x0 = random_tensor({37, 48}, 8), w0 = random_tensor({48}, 9), g = random_tensor({37, 48}, 10);
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor x = x0.clone(), w = w0.clone();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor y = ops::rms_norm(x, w, 1e-6f);
    y.backward(g);
    set_num_threads(1);
    return std::vector<std::vector<float>>{y.to_float_vector(), x.grad().to_float_vector(),
                                           w.grad().to_float_vector()};
  };
  EXPECT_EQ(run(1), run(2));
}

TEST(RmsNormOp, Errors) {
  Tensor x = Tensor::zeros({2, 4});
  EXPECT_THROW(ops::rms_norm(x, Tensor::ones({3}), 1e-5f), ShapeError);
  EXPECT_THROW(ops::rms_norm(x, Tensor::ones({1, 4}), 1e-5f), ShapeError);
  EXPECT_THROW(ops::rms_norm(Tensor::zeros({}), Tensor::ones({1}), 1e-5f), ShapeError);
  EXPECT_THROW(ops::rms_norm(Tensor::zeros({2, 4}, DType::I32), Tensor::ones({4}), 1e-5f), DTypeError);
  EXPECT_THROW(ops::rms_norm(x, Tensor::zeros({4}, DType::BF16), 1e-5f), DTypeError);
  EXPECT_THROW(ops::rms_norm(x, Tensor::ones({4}), -1.0f), ValueError);
  EXPECT_THROW(ops::rms_norm(x, Tensor(), 1e-5f), ValueError);
}

}  // namespace
}  // namespace corelm
