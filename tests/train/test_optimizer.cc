// Unit tests of SGD and AdamW: hand-computed steps, convergence on a quadratic, skipped
// parameters, zero_grad, per-parameter weight decay and argument errors. (The 10-step comparison
// with torch.optim lives in tests/oracle/test_optim_oracle.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "corelm/optim.h"

namespace corelm::optim {
namespace {

Tensor param(const std::vector<float>& values) {
  Tensor p = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  p.set_requires_grad(true);
  return p;
}

void set_grad(Tensor& p, const std::vector<float>& g) {
  p.set_grad(Tensor::from_vector(g, {static_cast<int64_t>(g.size())}));
}

void expect_values(const Tensor& t, const std::vector<float>& want, float tol = 1e-6f) {
  std::vector<float> got = t.to_float_vector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(SGD, PlainStepIsGradientDescent) {
  Tensor p = param({1.0f, 2.0f});
  SGD opt({p}, {.lr = 0.1f});
  set_grad(p, {0.5f, -1.0f});
  opt.step();
  expect_values(p, {0.95f, 2.1f});
}

TEST(SGD, MomentumWeightDecayAndDampening) {
  // torch: d = g + wd p; buf = d (first step), then buf = mu buf + (1 - damp) d; p -= lr buf.
  Tensor p = param({1.0f});
  SGD opt({p}, {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.5f, .weight_decay = 0.1f});
  set_grad(p, {1.0f});
  opt.step();  // d = 1.1, buf = 1.1, p = 1 - 0.11 = 0.89
  expect_values(p, {0.89f});
  set_grad(p, {1.0f});
  opt.step();  // d = 1.089, buf = 0.99 + 0.5445 = 1.5345, p = 0.89 - 0.15345
  expect_values(p, {0.89f - 0.15345f});
}

TEST(SGD, Nesterov) {
  Tensor p = param({1.0f});
  SGD opt({p}, {.lr = 0.1f, .momentum = 0.9f, .nesterov = true});
  set_grad(p, {1.0f});
  opt.step();  // buf = 1, d = 1 + 0.9 = 1.9, p = 0.81
  expect_values(p, {0.81f});
  set_grad(p, {1.0f});
  opt.step();  // buf = 1.9, d = 1 + 1.71 = 2.71, p = 0.81 - 0.271
  expect_values(p, {0.539f});
}

TEST(AdamW, FirstStepMovesByLearningRateAfterDecay) {
  // With bias correction the first update is lr * g / (|g| + eps') = lr * sign(g).
  Tensor p = param({1.0f, -2.0f});
  AdamW opt({p}, {.lr = 0.01f, .weight_decay = 0.1f});
  set_grad(p, {3.0f, -0.5f});
  opt.step();
  EXPECT_EQ(opt.step_count(), 1);
  const float decay = 1.0f - 0.01f * 0.1f;
  expect_values(p, {1.0f * decay - 0.01f, -2.0f * decay + 0.01f}, 1e-6f);
  expect_values(opt.exp_avg()[0], {0.3f, -0.05f});
  // 1 - beta2 is formed from the f32 option 0.999f, i.e. 1e-3 to within 1.3e-5 relative.
  expect_values(opt.exp_avg_sq()[0], {0.009f, 0.00025f}, 2e-7f);
}

TEST(AdamW, MinimisesQuadratic) {
  // f(p) = sum((p - c)^2), gradient through autograd.
  Tensor c = Tensor::from_vector(std::vector<float>{3.0f, -1.0f, 0.5f}, {3});
  Tensor p = param({0.0f, 0.0f, 0.0f});
  AdamW opt({p}, {.lr = 0.1f, .weight_decay = 0.0f});
  for (int it = 0; it < 300; ++it) {
    opt.zero_grad();
    Tensor loss = ops::sum(ops::square(ops::sub(p, c)));
    loss.backward();
    opt.step();
  }
  expect_values(p, {3.0f, -1.0f, 0.5f}, 2e-2f);
}

TEST(SGD, MinimisesQuadraticWithMomentum) {
  Tensor c = Tensor::from_vector(std::vector<float>{3.0f, -1.0f}, {2});
  Tensor p = param({0.0f, 0.0f});
  SGD opt({p}, {.lr = 0.05f, .momentum = 0.9f});
  for (int it = 0; it < 300; ++it) {
    opt.zero_grad();
    ops::sum(ops::square(ops::sub(p, c))).backward();
    opt.step();
  }
  expect_values(p, {3.0f, -1.0f}, 1e-3f);
}

TEST(Optimizer, ZeroGradDropsGradients) {
  Tensor a = param({1.0f}), b = param({2.0f});
  SGD opt({a, b}, {.lr = 0.1f});
  set_grad(a, {1.0f});
  set_grad(b, {1.0f});
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  opt.step();  // nothing to do
  expect_values(a, {1.0f});
  expect_values(b, {2.0f});
}

TEST(Optimizer, ParametersWithoutGradientAreSkipped) {
  Tensor a = param({1.0f}), b = param({2.0f});
  AdamW adamw({a, b}, {.lr = 0.1f, .weight_decay = 0.5f});
  set_grad(a, {1.0f});
  adamw.step();
  expect_values(b, {2.0f});  // no decay either: skipped entirely
  expect_values(adamw.exp_avg()[1], {0.0f});
  EXPECT_NE(a.to_float_vector()[0], 1.0f);

  Tensor c = param({1.0f}), d = param({2.0f});
  SGD sgd({c, d}, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.5f});
  set_grad(d, {1.0f});
  sgd.step();
  expect_values(c, {1.0f});
  expect_values(d, {2.0f - 0.1f * 2.0f});
}

TEST(AdamW, PerParameterWeightDecay) {
  // With a zero gradient the only change is the decoupled decay p *= 1 - lr * wd.
  Tensor w = param({2.0f}), norm = param({2.0f});
  AdamW opt({w, norm}, {.lr = 0.1f, .weight_decay = 0.5f});
  opt.set_weight_decay(1, 0.0f);
  set_grad(w, {0.0f});
  set_grad(norm, {0.0f});
  opt.step();
  expect_values(w, {2.0f * (1.0f - 0.05f)});
  expect_values(norm, {2.0f});
}

TEST(Optimizer, SetLrChangesTheStep) {
  Tensor p = param({1.0f});
  SGD opt({p}, {.lr = 0.1f});
  EXPECT_FLOAT_EQ(opt.lr(), 0.1f);
  opt.set_lr(0.5f);
  set_grad(p, {1.0f});
  opt.step();
  expect_values(p, {0.5f});
}

TEST(Optimizer, UpdatesDoNotRecordOnTheGraph) {
  Tensor p = param({1.0f, 2.0f});
  AdamW opt({p}, {});
  set_grad(p, {1.0f, 1.0f});
  opt.step();
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
}

TEST(Optimizer, RejectsBadArguments) {
  Tensor p = param({1.0f});
  EXPECT_THROW(SGD({p}, {.lr = 0.1f, .nesterov = true}), ValueError);
  EXPECT_THROW(SGD({p}, {.lr = -1.0f}), ValueError);
  EXPECT_THROW(AdamW({p}, {.beta1 = 1.0f}), ValueError);
  AdamW opt({p}, {});
  EXPECT_THROW(opt.set_weight_decay(3, 0.0f), IndexError);
  Tensor ints = Tensor::from_vector(std::vector<int32_t>{1, 2}, {2});
  EXPECT_THROW(SGD({ints}, {}), DTypeError);
  Tensor q = param({1.0f, 2.0f});
  SGD sgd({q}, {});
  // A gradient of the wrong shape is refused (by set_grad or, failing that, by step).
  EXPECT_THROW({
    set_grad(q, {1.0f});
    sgd.step();
  }, Error);
}

}  // namespace
}  // namespace corelm::optim
