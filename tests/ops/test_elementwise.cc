// Elementwise ops: broadcasting against an index-by-index expectation, strided inputs, unary
// values against <cmath>, gradients of every op, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::leaf;
using testing::randn;
using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);

// Values in [lo, hi): keeps log/sqrt/div away from their poles.
Tensor positive_leaf(const Shape& shape, uint64_t seed, float lo = 0.5f, float hi = 2.0f) {
  Generator gen(seed);
  Tensor t = Tensor::rand(shape, gen, lo, hi);
  t.set_requires_grad(true);
  return t;
}

struct BinaryCase {
  const char* name;
  BinaryFn op;
  std::function<float(float, float)> expect;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", &ops::add, [](float x, float y) { return x + y; }},
      {"sub", &ops::sub, [](float x, float y) { return x - y; }},
      {"mul", &ops::mul, [](float x, float y) { return x * y; }},
      {"div", &ops::div, [](float x, float y) { return x / y; }},
  };
  return cases;
}

TEST(Elementwise, SameShapeValues) {
  Tensor a = randn({3, 5}, 1);
  Generator gen(2);
  Tensor b = Tensor::rand({3, 5}, gen, 0.5f, 2.0f);
  std::vector<float> va = a.to_float_vector(), vb = b.to_float_vector();
  for (const auto& c : binary_cases()) {
    std::vector<float> out = c.op(a, b).to_float_vector();
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], c.expect(va[i], vb[i])) << c.name << " at " << i;
  }
}

TEST(Elementwise, BroadcastingFollowsPyTorchRules) {
  // a [2, 3, 1] with b [4] -> [2, 3, 4]; out[i, j, k] = a[i, j, 0] op b[k].
  Tensor a = randn({2, 3, 1}, 3);
  Tensor b = Tensor::from_vector(std::vector<float>{1, 2, 4, 8}, {4});
  std::vector<float> va = a.to_float_vector(), vb = b.to_float_vector();
  for (const auto& c : binary_cases()) {
    Tensor y = c.op(a, b);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 4})) << c.name;
    std::vector<float> out = y.to_float_vector();
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t k = 0; k < 4; ++k)
        EXPECT_EQ(out[i * 4 + k], c.expect(va[i], vb[k])) << c.name;
    // Broadcasting is symmetric in shape: b op a gives the same shape.
    EXPECT_EQ(c.op(b, a).shape(), (Shape{2, 3, 4})) << c.name;
  }
}

TEST(Elementwise, BroadcastsBothWaysAndZeroDim) {
  Tensor col = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3, 1});
  Tensor row = Tensor::from_vector(std::vector<float>{10, 20}, {1, 2});
  EXPECT_EQ(ops::add(col, row).to_float_vector(), (std::vector<float>{11, 21, 12, 22, 13, 23}));
  Tensor s = Tensor::full({}, 2.0);
  Tensor y = ops::mul(col, s);
  EXPECT_EQ(y.shape(), (Shape{3, 1}));
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{2, 4, 6}));
  Tensor z = ops::sub(s, s);
  EXPECT_EQ(z.shape(), Shape{});
  EXPECT_EQ(z.item(), 0.0);
}

TEST(Elementwise, NonContiguousInputsMatchTheirCopies) {
  Tensor base = randn({4, 6}, 4);
  Tensor a = ops::transpose(base, 0, 1);              // [6, 4], strided
  Tensor b = ops::slice(randn({6, 8}, 5), 1, 0, 8, 2);  // [6, 4], strided
  for (const auto& c : binary_cases())
    EXPECT_EQ(c.op(a, b).to_float_vector(), c.op(a.clone(), b.clone()).to_float_vector()) << c.name;
  EXPECT_EQ(ops::exp(a).to_float_vector(), ops::exp(a.clone()).to_float_vector());
}

TEST(Elementwise, UnaryValues) {
  Tensor x = Tensor::from_vector(std::vector<float>{0.25f, 1.0f, 2.0f, 9.0f}, {2, 2});
  std::vector<float> v = x.to_float_vector();
  struct Case {
    Tensor y;
    std::function<float(float)> f;
  };
  std::vector<Case> cases = {
      {ops::neg(x), [](float t) { return -t; }},
      {ops::exp(x), [](float t) { return std::exp(t); }},
      {ops::log(x), [](float t) { return std::log(t); }},
      {ops::sqrt(x), [](float t) { return std::sqrt(t); }},
      {ops::square(x), [](float t) { return t * t; }},
      {ops::scale(x, -1.5f), [](float t) { return t * -1.5f; }},
      {ops::add_scalar(x, 0.5f), [](float t) { return t + 0.5f; }},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.y.shape(), x.shape());
    std::vector<float> out = c.y.to_float_vector();
    for (size_t i = 0; i < v.size(); ++i) EXPECT_FLOAT_EQ(out[i], c.f(v[i]));
  }
}

TEST(Elementwise, BinaryGradientsWithBroadcasting) {
  for (const auto& c : binary_cases()) {
    SCOPED_TRACE(c.name);
    BinaryFn op = c.op;
    auto fn = [op](const std::vector<Tensor>& in) { return op(in[0], in[1]); };
    expect_gradients_match(fn, {leaf({2, 3, 4}, 10), positive_leaf({3, 1}, 11)});
    expect_gradients_match(fn, {leaf({4}, 12), positive_leaf({2, 1, 4}, 13)});
    expect_gradients_match(fn, {leaf({3, 4}, 14), positive_leaf({3, 4}, 15)});
  }
}

TEST(Elementwise, GradientThroughStridedInput) {
  expect_gradients_match([](const std::vector<Tensor>& in) {
    return ops::mul(ops::transpose(in[0], 0, 1), in[1]);
  }, {leaf({4, 3}, 16), leaf({3, 4}, 17)});
}

TEST(Elementwise, SameTensorOnBothSides) {
  Tensor x = leaf({5}, 18);
  ops::sum(ops::mul(x, x)).backward();
  std::vector<float> g = x.grad().to_float_vector(), v = x.to_float_vector();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_FLOAT_EQ(g[i], 2 * v[i]);
}

TEST(Elementwise, UnaryGradients) {
  using Fn = std::function<Tensor(const Tensor&)>;
  std::vector<std::pair<const char*, Fn>> cases = {
      {"neg", [](const Tensor& x) { return ops::neg(x); }},
      {"exp", [](const Tensor& x) { return ops::exp(x); }},
      {"log", [](const Tensor& x) { return ops::log(x); }},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }},
      {"square", [](const Tensor& x) { return ops::square(x); }},
      {"scale", [](const Tensor& x) { return ops::scale(x, -2.5f); }},
      {"add_scalar", [](const Tensor& x) { return ops::add_scalar(x, 3.0f); }},
  };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    expect_gradients_match([f](const std::vector<Tensor>& in) { return f(in[0]); },
                           {positive_leaf({3, 4}, 19)});
  }
}

TEST(Elementwise, RejectsIncompatibleShapes) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  for (const auto& c : binary_cases()) {
    try {
      c.op(a, b);
      ADD_FAILURE() << c.name << " accepted [2, 3] with [4]";
    } catch (const ShapeError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(c.name), std::string::npos) << msg;
      EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
    }
  }
}

TEST(Elementwise, RejectsNonF32) {
  Tensor f = Tensor::zeros({2}), i = Tensor::zeros({2}, DType::I64);
  for (const auto& c : binary_cases()) {
    EXPECT_THROW(c.op(f, i), DTypeError) << c.name;
    EXPECT_THROW(c.op(i, f), DTypeError) << c.name;
  }
  EXPECT_THROW(ops::exp(i), DTypeError);
  EXPECT_THROW(ops::scale(Tensor::zeros({2}, DType::BF16), 2.0f), DTypeError);
  EXPECT_THROW(ops::add(Tensor(), f), ValueError);
}

TEST(Elementwise, ThreadCountDoesNotChangeResults) {
  Tensor a = randn({64, 257}, 20), b = randn({257}, 21);
  set_num_threads(1);
  std::vector<float> one = ops::div(ops::exp(a), b).to_float_vector();
  set_num_threads(2);
  std::vector<float> two = ops::div(ops::exp(a), b).to_float_vector();
  set_num_threads(1);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace corelm
