// RoPE: HF rotate-half values, norm preservation, position-offset consistency, gradients, errors.
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

// Rotate-half in double precision: the exact rotation the f32 kernel approximates.
std::vector<double> naive_rope(const std::vector<float>& x, const Shape& shape, double theta, int64_t offset) {
  const int64_t rows = shape[0] * shape[1], T = shape[2], D = shape[3], h = D / 2;
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x.data() + (r * T + t) * D;
      double* yr = y.data() + (r * T + t) * D;
      for (int64_t i = 0; i < h; ++i) {
        const double angle = double(offset + t) * std::pow(theta, -2.0 * i / D);
        yr[i] = xr[i] * std::cos(angle) - xr[i + h] * std::sin(angle);
        yr[i + h] = xr[i + h] * std::cos(angle) + xr[i] * std::sin(angle);
      }
    }
  }
  return y;
}

TEST(RopeOp, MatchesRotateHalf) {
  const Shape shape{2, 3, 5, 8};
  Tensor x = random_tensor(shape, 1);
  for (int64_t offset : {0, 7}) {
    auto want = naive_rope(x.to_float_vector(), shape, 10000.0, offset);
    Tensor y = ops::rope(x, 10000.0f, offset);
    EXPECT_EQ(y.shape(), shape);
    auto got = y.to_float_vector();
    // f32 angles (as in HF) drift from the exact ones by ~pos * 1 ulp.
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-5) << i;
  }
}

TEST(RopeOp, PositionZeroIsIdentity) {
  Tensor x = random_tensor({1, 2, 1, 6}, 2);
  EXPECT_EQ(ops::rope(x, 500000.0f).to_float_vector(), x.to_float_vector());
}

TEST(RopeOp, PreservesPairNorms) {
  const int64_t D = 16, T = 9;
  Tensor x = random_tensor({1, 2, T, D}, 3);
  auto xv = x.to_float_vector();
  auto yv = ops::rope(x, 10000.0f, 1000).to_float_vector();
  for (int64_t row = 0; row < 2 * T; ++row) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const int64_t a = row * D + i, b = a + D / 2;
      EXPECT_NEAR(std::hypot(yv[a], yv[b]), std::hypot(xv[a], xv[b]), 1e-5);
    }
  }
}

TEST(RopeOp, OffsetMatchesLaterPositions) {
  const int64_t a = 5, T = 4;
  Tensor full = random_tensor({2, 2, a + T, 8}, 4);
  auto whole = ops::rope(full, 10000.0f, 0);
  auto tail = ops::rope(full.slice(2, a, a + T), 10000.0f, a);
  EXPECT_EQ(tail.to_float_vector(), whole.slice(2, a, a + T).contiguous().to_float_vector());
}

TEST(RopeOp, NonContiguousInput) {
  Tensor x = random_tensor({2, 3, 4, 6}, 5).transpose(1, 2);  // [2, 4, 3, 6]
  EXPECT_EQ(ops::rope(x, 100.0f, 2).to_float_vector(), ops::rope(x.contiguous(), 100.0f, 2).to_float_vector());
}

TEST(RopeOp, Gradient) {
  Tensor x = random_tensor({1, 2, 3, 4}, 6);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::rope(in[0], 10.0f, 3); }, {leaf(x)});
}

TEST(RopeOp, ThreadCountInvariant) {
  Tensor x = random_tensor({2, 4, 33, 16}, 7);
  set_num_threads(1);
  auto one = ops::rope(x, 10000.0f, 11).to_float_vector();
  set_num_threads(2);
  auto two = ops::rope(x, 10000.0f, 11).to_float_vector();
  set_num_threads(1);
  EXPECT_EQ(one, two);
}

TEST(RopeOp, Errors) {
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 1, 2, 5}), 10000.0f), ShapeError);
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 2, 4}), 10000.0f), ShapeError);
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 1, 2, 4}, DType::I64), 10000.0f), DTypeError);
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 1, 2, 4}), 0.0f), ValueError);
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 1, 2, 4}), 10000.0f, -1), ValueError);
}

}  // namespace
}  // namespace corelm
