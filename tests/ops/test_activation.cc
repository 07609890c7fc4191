// Activations: SiLU, SwiGLU, softmax / log_softmax over any dim, dropout.
#include <gtest/gtest.h>

#include <cmath>
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

double naive_silu(double x) { return x / (1.0 + std::exp(-x)); }

// Softmax over `dim` of a row-major tensor, in double, for comparison.
std::vector<double> naive_softmax(const std::vector<float>& x, const Shape& shape, int64_t dim,
                                  bool log_space) {
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= shape[i];
  for (size_t i = dim + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t n = shape[dim];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      auto at = [&](int64_t j) { return (o * n + j) * inner + in; };
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, double(x[at(j)]));
      double total = 0.0;
      for (int64_t j = 0; j < n; ++j) total += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) {
        y[at(j)] = log_space ? (x[at(j)] - m) - std::log(total) : std::exp(x[at(j)] - m) / total;
      }
    }
  }
  return y;
}

TEST(SiluOp, MatchesNaive) {
  Tensor x = random_tensor({3, 7}, 1, 3.0f);
  auto xv = x.to_float_vector();
  auto y = ops::silu(x).to_float_vector();
  ASSERT_EQ(y.size(), xv.size());
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(y[i], naive_silu(xv[i]), 1e-6 * (1 + std::abs(xv[i])));
  EXPECT_EQ(ops::silu(x).shape(), x.shape());
}

TEST(SiluOp, ExtremeInputsStayFinite) {
  Tensor x = Tensor::from_vector(std::vector<float>{-1000.f, -80.f, 0.f, 80.f, 1000.f}, {5});
  auto y = ops::silu(x).to_float_vector();
  EXPECT_FLOAT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(y[2], 0.0f);
  EXPECT_FLOAT_EQ(y[3], 80.0f);
  EXPECT_FLOAT_EQ(y[4], 1000.0f);
}

TEST(SiluOp, Gradient) {
  Tensor x = random_tensor({4, 5}, 2, 2.0f);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::silu(in[0]); }, {leaf(x)});
}

TEST(SiluOp, RejectsIntegerInput) {
  EXPECT_THROW(ops::silu(Tensor::zeros({3}, DType::I32)), DTypeError);
}

TEST(SwigluOp, MatchesNaive) {
  Tensor gate = random_tensor({2, 3, 4}, 3, 2.0f), up = random_tensor({2, 3, 4}, 4);
  auto g = gate.to_float_vector(), u = up.to_float_vector();
  auto y = ops::swiglu(gate, up).to_float_vector();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(y[i], naive_silu(g[i]) * u[i], 1e-5);
}

TEST(SwigluOp, NonContiguousInputs) {
  Tensor gate = random_tensor({4, 3}, 5), up = random_tensor({4, 3}, 6);
  Tensor gate_t = gate.transpose(0, 1), up_t = up.transpose(0, 1);
  auto got = ops::swiglu(gate_t, up_t).to_float_vector();
  auto want = ops::swiglu(gate_t.contiguous(), up_t.contiguous()).to_float_vector();
  EXPECT_EQ(got, want);
}

TEST(SwigluOp, Gradient) {
  Tensor gate = random_tensor({3, 4}, 7, 2.0f), up = random_tensor({3, 4}, 8);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::swiglu(in[0], in[1]); }, {leaf(gate), leaf(up)});
}

TEST(SwigluOp, Errors) {
  EXPECT_THROW(ops::swiglu(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})), ShapeError);
  EXPECT_THROW(ops::swiglu(Tensor::zeros({2, 3}), Tensor::zeros({2, 3}, DType::I64)), DTypeError);
}

TEST(SoftmaxOp, MatchesNaiveOnEveryDim) {
  const Shape shape{2, 3, 4};
  Tensor x = random_tensor(shape, 9, 3.0f);
  auto xv = x.to_float_vector();
  for (int64_t dim = 0; dim < 3; ++dim) {
    for (bool log_space : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " log " << log_space);
      auto want = naive_softmax(xv, shape, dim, log_space);
      auto got = (log_space ? ops::log_softmax(x, dim) : ops::softmax(x, dim)).to_float_vector();
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);
      auto neg = (log_space ? ops::log_softmax(x, dim - 3) : ops::softmax(x, dim - 3)).to_float_vector();
      EXPECT_EQ(neg, got);
    }
  }
}

TEST(SoftmaxOp, RowsSumToOneAndStableForLargeInputs) {
  Tensor x = Tensor::from_vector(std::vector<float>{1000.f, 1001.f, 999.f, -1000.f, -1e30f, 0.f}, {2, 3});
  auto y = ops::softmax(x).to_float_vector();
  for (int r = 0; r < 2; ++r) {
    double total = 0.0;
    for (int j = 0; j < 3; ++j) {
      EXPECT_TRUE(std::isfinite(y[r * 3 + j]));
      total += y[r * 3 + j];
    }
    EXPECT_NEAR(total, 1.0, 1e-6);
  }
  auto ly = ops::log_softmax(x).to_float_vector();
  for (float v : ly) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(ly[1], -std::log(1.0 + std::exp(-1.0) + std::exp(-2.0)), 1e-5);
}

TEST(SoftmaxOp, ScalarIsOneRowOfOne) {
  Tensor x = Tensor::full({}, 3.5);
  EXPECT_EQ(ops::softmax(x).item(), 1.0);
  EXPECT_EQ(ops::log_softmax(x, 0).item(), 0.0);
  EXPECT_THROW(ops::softmax(x, 1), IndexError);
}

TEST(SoftmaxOp, NonContiguousInput) {
  Tensor x = random_tensor({5, 4}, 10).transpose(0, 1);
  EXPECT_EQ(ops::softmax(x, 1).to_float_vector(), ops::softmax(x.contiguous(), 1).to_float_vector());
  EXPECT_EQ(ops::log_softmax(x, 0).to_float_vector(),
            ops::log_softmax(x.contiguous(), 0).to_float_vector());
}

TEST(SoftmaxOp, Gradients) {
  Tensor x = random_tensor({2, 3, 4}, 11);
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    expect_gradients_match([dim](const std::vector<Tensor>& in) { return ops::softmax(in[0], dim); }, {leaf(x)});
    expect_gradients_match([dim](const std::vector<Tensor>& in) { return ops::log_softmax(in[0], dim); },
                           {leaf(x)});
  }
}

TEST(SoftmaxOp, ThreadCountInvariant) {
  Tensor x = random_tensor({64, 33}, 12);
  set_num_threads(1);
  auto one = ops::softmax(x, 0).to_float_vector();
  set_num_threads(2);
  auto two = ops::softmax(x, 0).to_float_vector();
  set_num_threads(1);
  EXPECT_EQ(one, two);
}

TEST(SoftmaxOp, Errors) {
  Tensor x = Tensor::zeros({2, 3});
  EXPECT_THROW(ops::softmax(x, 2), IndexError);
  EXPECT_THROW(ops::log_softmax(x, -3), IndexError);
  EXPECT_THROW(ops::softmax(Tensor::zeros({2}, DType::I32)), DTypeError);
}

TEST(DropoutOp, IdentityWhenEvalOrZeroP) {
  Generator gen(1);
  Tensor x = random_tensor({3, 4}, 13);
  EXPECT_EQ(ops::dropout(x, 0.5f, /*training=*/false, gen).id(), x.id());
  EXPECT_EQ(ops::dropout(x, 0.0f, /*training=*/true, gen).id(), x.id());
}

TEST(DropoutOp, MaskFollowsGeneratorRowMajor) {
  const float p = 0.4f;
  Tensor x = random_tensor({5, 6}, 14);
  Generator gen(42), replay(42);
  auto y = ops::dropout(x, p, true, gen).to_float_vector();
  auto xv = x.to_float_vector();
  for (size_t i = 0; i < xv.size(); ++i) {
    const bool dropped = replay.uniform() < p;
    EXPECT_EQ(y[i], dropped ? 0.0f : xv[i] * (1.0f / (1.0f - p))) << "element " << i;
  }
}

TEST(DropoutOp, ReproducibleWithSeedAndPreservesMean) {
  Tensor x = Tensor::ones({200, 500});
  Generator a(7), b(7), c(8);
  auto ya = ops::dropout(x, 0.3f, true, a).to_float_vector();
  auto yb = ops::dropout(x, 0.3f, true, b).to_float_vector();
  auto yc = ops::dropout(x, 0.3f, true, c).to_float_vector();
  EXPECT_EQ(ya, yb);
  EXPECT_NE(ya, yc);
  double total = 0.0;
  int64_t zeros = 0;
  for (float v : ya) {
    total += v;
    zeros += v == 0.0f;
  }
  EXPECT_NEAR(total / ya.size(), 1.0, 0.01);
  EXPECT_NEAR(double(zeros) / ya.size(), 0.3, 0.01);
}

TEST(DropoutOp, Gradient) {
  Tensor x = random_tensor({4, 6}, 15);
  // A fresh generator per call so every evaluation sees the same mask.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Generator gen(3);
        return ops::dropout(in[0], 0.25f, true, gen);
      },
      {leaf(x)});
}

TEST(DropoutOp, Errors) {
  Generator gen(1);
  Tensor x = Tensor::zeros({4});
  EXPECT_THROW(ops::dropout(x, 1.0f, true, gen), ValueError);
  EXPECT_THROW(ops::dropout(x, -0.1f, true, gen), ValueError);
  EXPECT_THROW(ops::dropout(x, NAN, true, gen), ValueError);
  EXPECT_THROW(ops::dropout(Tensor::zeros({4}, DType::I32), 0.1f, true, gen), DTypeError);
}

}  // namespace
}  // namespace corelm
