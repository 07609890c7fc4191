// Engine tests with hand-made nodes (no ops), so a failure here is the engine's own.
#include <gtest/gtest.h>

#include "corelm/autograd.h"

using namespace corelm;

namespace {
// y = x * c elementwise, recorded with a lambda node.
Tensor times(const Tensor& x, float c) {
  Tensor y = x.clone().detach();
  float* p = y.data<float>();
  for (int64_t i = 0; i < y.numel(); ++i) p[i] *= c;
  if (autograd::needs_grad({x}))
    autograd::record(y, "times", {x}, [c](const Tensor& g) {
      Tensor gx = g.contiguous().clone();
      float* q = gx.data<float>();
      for (int64_t i = 0; i < gx.numel(); ++i) q[i] *= c;
      return std::vector<Tensor>{gx};
    });
  return y;
}

// s = sum(a) + sum(b) as a scalar.
Tensor sum2(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (float v : a.to_float_vector()) s += v;
  for (float v : b.to_float_vector()) s += v;
  Tensor out = Tensor::full({}, s);
  if (autograd::needs_grad({a, b}))
    autograd::record(out, "sum2", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
      double gv = g.item();
      return std::vector<Tensor>{Tensor::full(sa, gv), Tensor::full(sb, gv)};
    });
  return out;
}

Tensor leaf(std::vector<float> v) {
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  t.set_requires_grad(true);
  return t;
}
}  // namespace

TEST(Autograd, ChainAndDiamondAccumulate) {
  Tensor x = leaf({1, 2, 3});
  // Diamond: x feeds two branches that meet again: d/dx (2x + 3x) = 5.
  Tensor loss = sum2(times(x, 2), times(x, 3));
  EXPECT_FALSE(loss.is_leaf());
  loss.backward();
  EXPECT_EQ(x.grad().to_float_vector(), (std::vector<float>{5, 5, 5}));
}

TEST(Autograd, GradientsAccumulateAcrossBackwardsUntilZeroGrad) {
  Tensor x = leaf({1, 1});
  Tensor y = leaf({0});
  sum2(times(x, 4), y).backward();
  sum2(times(x, 4), y).backward();
  EXPECT_EQ(x.grad().to_float_vector(), (std::vector<float>{8, 8}));
  EXPECT_EQ(y.grad().to_float_vector(), (std::vector<float>{2}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  sum2(times(x, 4), y).backward();
  EXPECT_EQ(x.grad().to_float_vector(), (std::vector<float>{4, 4}));
}

TEST(Autograd, SharedGradientsAreNotAliased) {
  // Both leaves get the same upstream tensor; scaling one leaf's grad must not touch the other.
  Tensor a = leaf({1}), b = leaf({1});
  sum2(a, b).backward();
  a.grad().data<float>()[0] = 42;
  EXPECT_EQ(b.grad().to_float_vector()[0], 1);
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = leaf({1, 2});
  {
    autograd::NoGradGuard guard;
    EXPECT_FALSE(autograd::grad_mode_enabled());
    Tensor y = times(x, 2);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
  }
  EXPECT_TRUE(autograd::grad_mode_enabled());
  EXPECT_TRUE(times(x, 2).requires_grad());
}

TEST(Autograd, InputsWithoutRequiresGradGetNoGradient) {
  Tensor x = leaf({1});
  Tensor c = Tensor::from_vector(std::vector<float>{5}, {1});
  sum2(x, c).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(c.grad().defined());
}

TEST(Autograd, DetachCutsTheGraph) {
  Tensor x = leaf({1, 2});
  Tensor y = times(x, 3).detach();
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{3, 6}));
}

TEST(Autograd, ExplicitSeedGradient) {
  Tensor x = leaf({1, 2});
  Tensor y = times(x, 3);
  y.backward(Tensor::from_vector(std::vector<float>{1, 10}, {2}));
  EXPECT_EQ(x.grad().to_float_vector(), (std::vector<float>{3, 30}));
}

TEST(Autograd, DeepChainDoesNotOverflowTheStack) {
  Tensor x = leaf({1});
  Tensor y = x;
  for (int i = 0; i < 20000; ++i) y = times(y, 1.0f);
  y.backward(Tensor::ones({1}));
  EXPECT_EQ(x.grad().to_float_vector()[0], 1.0f);
}

TEST(Autograd, Errors) {
  Tensor x = leaf({1, 2});
  EXPECT_THROW(times(x, 2).backward(), AutogradError);  // non-scalar needs a seed
  EXPECT_THROW(times(x, 2).backward(Tensor::ones({3})), ShapeError);
  Tensor plain = Tensor::ones({1});
  EXPECT_THROW(plain.backward(), AutogradError);  // nothing requires grad
  EXPECT_THROW(times(x, 2).set_requires_grad(false), AutogradError);  // not a leaf
  EXPECT_THROW(Tensor().backward(), AutogradError);
}

TEST(Autograd, WrongGradientShapeFromANodeIsReported) {
  Tensor x = leaf({1, 2});
  Tensor y = Tensor::full({}, 0.0);
  autograd::record(y, "broken", {x}, [](const Tensor&) { return std::vector<Tensor>{Tensor::ones({5})}; });
  try {
    y.backward();
    FAIL();
  } catch (const AutogradError& e) {
    EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos);
  }
}
