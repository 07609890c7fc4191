// Cross-entropy: values and gradients against a double-precision loop, ignore_index, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/tensor.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::leaf;
using testing::random_tensor;

struct NaiveLoss {
  double loss = 0.0;
  std::vector<double> grad;
};

NaiveLoss naive_cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets, int64_t ignore) {
  const int64_t N = logits.size(0), V = logits.size(1);
  auto x = logits.to_float_vector();
  NaiveLoss r;
  r.grad.assign(N * V, 0.0);
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) count += targets[i] != ignore;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] == ignore) continue;
    double m = -INFINITY, total = 0.0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(x[i * V + j]));
    for (int64_t j = 0; j < V; ++j) total += std::exp(x[i * V + j] - m);
    r.loss += (m + std::log(total) - x[i * V + targets[i]]) / count;
    for (int64_t j = 0; j < V; ++j)
      r.grad[i * V + j] = (std::exp(x[i * V + j] - m) / total - (j == targets[i])) / count;
  }
  return r;
}

std::vector<float> loss_gradient(const Tensor& logits0, const Tensor& targets, int64_t ignore = -100) {
  Tensor logits = logits0.clone();
  logits.set_requires_grad(true);
  Tensor loss = ops::cross_entropy(logits, targets, ignore);
  loss.backward();
  return logits.grad().to_float_vector();
}

TEST(CrossEntropyOp, MatchesNaiveWithI64AndI32Targets) {
  Tensor logits = random_tensor({4, 5}, 1, 2.0f);
  const std::vector<int64_t> ids{1, 0, 4, 2};
  auto want = naive_cross_entropy(logits, ids, -100);
  for (Tensor targets : {Tensor::from_vector(ids, {4}),
                         Tensor::from_vector(std::vector<int32_t>{1, 0, 4, 2}, {4})}) {
    Tensor loss = ops::cross_entropy(logits, targets);
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_NEAR(loss.item(), want.loss, 1e-5);
    auto grad = loss_gradient(logits, targets);
    for (size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(grad[i], want.grad[i], 1e-6);
  }
}

TEST(CrossEntropyOp, IgnoredRowsLeaveTheMean) {
  Tensor logits = random_tensor({5, 3}, 2);
  for (int64_t ignore : {int64_t{-100}, int64_t{-1}, int64_t{2}}) {
    const std::vector<int64_t> ids{0, ignore, 2, ignore, 1};
    auto want = naive_cross_entropy(logits, ids, ignore);
    Tensor targets = Tensor::from_vector(ids, {5});
    EXPECT_NEAR(ops::cross_entropy(logits, targets, ignore).item(), want.loss, 1e-5) << ignore;
    auto grad = loss_gradient(logits, targets, ignore);
    for (size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(grad[i], want.grad[i], 1e-6);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(grad[1 * 3 + j], 0.0f);
  }
}

// Deliberately unlike PyTorch (nan): a batch with no counted target has loss 0 and no gradient.
TEST(CrossEntropyOp, AllIgnoredGivesZeroLossAndZeroGradient) {
  Tensor logits = random_tensor({3, 4}, 3);
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
  EXPECT_EQ(ops::cross_entropy(logits, targets).item(), 0.0);
  for (float g : loss_gradient(logits, targets)) EXPECT_EQ(g, 0.0f);
}

TEST(CrossEntropyOp, StableForLargeLogits) {
  Tensor logits = Tensor::from_vector(std::vector<float>{1000.f, 999.f, -1000.f, -1e30f, 0.f, 1e30f}, {2, 3});
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2});
  const double loss = ops::cross_entropy(logits, targets).item();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, (std::log(1.0 + std::exp(1.0) + 0.0) + 0.0) / 2, 1e-5);
  for (float g : loss_gradient(logits, targets)) EXPECT_TRUE(std::isfinite(g));
}

TEST(CrossEntropyOp, NonContiguousLogits) {
  Tensor logits = random_tensor({6, 4}, 4).transpose(0, 1);  // [4, 6]
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{5, 0, 3, 3}, {4});
  EXPECT_EQ(ops::cross_entropy(logits, targets).item(), ops::cross_entropy(logits.contiguous(), targets).item());
}

TEST(CrossEntropyOp, Gradient) {
  Tensor logits = random_tensor({4, 6}, 5);
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{3, -100, 0, 5}, {4});
  expect_gradients_match(
      [targets](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], targets); }, {leaf(logits)});
}

TEST(CrossEntropyOp, ThreadCountInvariant) {
  Tensor logits = random_tensor({50, 37}, 6);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 50; ++i) ids.push_back((i * 7) % 37);
  Tensor targets = Tensor::from_vector(ids, {50});
  set_num_threads(1);
  const double one = ops::cross_entropy(logits, targets).item();
  auto grad_one = loss_gradient(logits, targets);
  set_num_threads(2);
  const double two = ops::cross_entropy(logits, targets).item();
  auto grad_two = loss_gradient(logits, targets);
  set_num_threads(1);
  EXPECT_EQ(one, two);
  EXPECT_EQ(grad_one, grad_two);
}

TEST(CrossEntropyOp, TargetOutOfRangeNamesRowAndValue) {
  Tensor logits = Tensor::zeros({3, 4});
  try {
    ops::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 1, 4}, {3}));
    FAIL() << "expected IndexError";
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("target 4"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::cross_entropy(logits, Tensor::from_vector(std::vector<int32_t>{0, -1, 0}, {3})), IndexError);
  // -100 is only special when it is the ignore_index.
  EXPECT_THROW(ops::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{-100, 0, 0}, {3}), -1),
               IndexError);
}

TEST(CrossEntropyOp, ShapeAndDTypeErrors) {
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 1}, {2});
  EXPECT_THROW(ops::cross_entropy(Tensor::zeros({4}), targets), ShapeError);
  EXPECT_THROW(ops::cross_entropy(Tensor::zeros({2, 3, 4}), targets), ShapeError);
  EXPECT_THROW(ops::cross_entropy(Tensor::zeros({3, 4}), targets), ShapeError);
  EXPECT_THROW(ops::cross_entropy(Tensor::zeros({2, 4}), Tensor::zeros({2, 1}, DType::I64)), ShapeError);
  EXPECT_THROW(ops::cross_entropy(Tensor::zeros({2, 4}), Tensor::zeros({2})), DTypeError);
  EXPECT_THROW(ops::cross_entropy(Tensor::zeros({2, 4}, DType::I32), targets), DTypeError);
}

}  // namespace
}  // namespace corelm
