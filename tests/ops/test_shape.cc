// Differentiable shape ops: values of the views, their gradients, and argument errors.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/ops.h"
#include "corelm/random.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::leaf;


std::vector<float> iota(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

TEST(ShapeOps, ReshapeKeepsOrderAndInfersMinusOne) {
  Tensor x = Tensor::from_vector(iota(6), {2, 3});
  Tensor y = ops::reshape(x, {3, -1});
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_float_vector(), iota(6));
}

TEST(ShapeOps, ReshapeOfNonContiguousCopiesInLogicalOrder) {
  Tensor x = Tensor::from_vector(iota(6), {2, 3});
  Tensor y = ops::reshape(ops::transpose(x, 0, 1), {6});
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(ShapeOps, ReshapeRejectsWrongElementCount) {
  Tensor x = Tensor::zeros({2, 3});
  EXPECT_THROW(ops::reshape(x, {4, 2}), ShapeError);
  EXPECT_THROW(ops::reshape(x, {-1, -1}), ShapeError);
  EXPECT_THROW(ops::reshape(x, {4, -1}), ShapeError);
}

TEST(ShapeOps, ReshapeGradient) {
  expect_gradients_match([](const std::vector<Tensor>& in) {
    return ops::reshape(ops::transpose(in[0], 0, 2), {4, -1});
  }, {leaf({2, 3, 4}, 1)});
}

TEST(ShapeOps, TransposeValuesAndNegativeDims) {
  Tensor x = Tensor::from_vector(iota(6), {2, 3});
  Tensor y = ops::transpose(x, -1, -2);
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(ops::transpose(x, 0, 2), IndexError);
}

TEST(ShapeOps, TransposeGradient) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::transpose(in[0], 0, 1); },
                         {leaf({3, 4}, 2)});
}

TEST(ShapeOps, PermuteValues) {
  Tensor x = Tensor::from_vector(iota(24), {2, 3, 4});
  Tensor y = ops::permute(x, {2, 0, 1});
  ASSERT_EQ(y.shape(), (Shape{4, 2, 3}));
  std::vector<float> v = y.to_float_vector();
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(v[(k * 2 + i) * 3 + j], (i * 3 + j) * 4 + k);
}

TEST(ShapeOps, PermuteRejectsBadDims) {
  Tensor x = Tensor::zeros({2, 3, 4});
  EXPECT_THROW(ops::permute(x, {0, 1}), ShapeError);
  EXPECT_THROW(ops::permute(x, {0, 1, 1}), ValueError);
  EXPECT_THROW(ops::permute(x, {0, 1, 3}), IndexError);
}

TEST(ShapeOps, PermuteGradient) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::permute(in[0], {1, 2, 0}); },
                         {leaf({2, 3, 4}, 3)});
}

TEST(ShapeOps, SliceWithStepAndNegativeBounds) {
  Tensor x = Tensor::from_vector(iota(10), {10});
  EXPECT_EQ(ops::slice(x, 0, 1, 8, 3).to_float_vector(), (std::vector<float>{1, 4, 7}));
  EXPECT_EQ(ops::slice(x, 0, -3, 10).to_float_vector(), (std::vector<float>{7, 8, 9}));
  Tensor m = Tensor::from_vector(iota(12), {3, 4});
  EXPECT_EQ(ops::slice(m, 1, 1, 3).to_float_vector(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
}

TEST(ShapeOps, SliceRejectsBadArguments) {
  Tensor x = Tensor::zeros({3, 4});
  EXPECT_THROW(ops::slice(x, 2, 0, 1), IndexError);
  EXPECT_THROW(ops::slice(x, 0, 0, 2, 0), ValueError);
}

TEST(ShapeOps, SliceGradientScattersIntoZeros) {
  Tensor x = leaf({4, 5}, 4);
  ops::sum(ops::slice(x, 1, 1, 5, 2)).backward();
  std::vector<float> g = x.grad().to_float_vector();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(g[i * 5 + j], (j == 1 || j == 3) ? 1.0f : 0.0f);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::slice(in[0], 0, 1, 3); },
                         {leaf({4, 5}, 5)});
}

TEST(ShapeOps, ContiguousCopiesViewsOnly) {
  Tensor x = Tensor::from_vector(iota(6), {2, 3});
  EXPECT_EQ(ops::contiguous(x).id(), x.id());
  Tensor t = ops::contiguous(ops::transpose(x, 0, 1));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  expect_gradients_match([](const std::vector<Tensor>& in) {
    return ops::contiguous(ops::transpose(in[0], 0, 1));
  }, {leaf({3, 2}, 6)});
}

TEST(ShapeOps, ConcatAlongEachDim) {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector(std::vector<float>{5, 6}, {1, 2});
  EXPECT_EQ(ops::concat({a, b}, 0).to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  Tensor c = Tensor::from_vector(std::vector<float>{7, 8}, {2, 1});
  Tensor y = ops::concat({a, c}, -1);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{1, 2, 7, 3, 4, 8}));
  // Non-contiguous inputs are read in logical order.
  Tensor at = ops::transpose(a, 0, 1);
  EXPECT_EQ(ops::concat({at, c}, 1).to_float_vector(), (std::vector<float>{1, 3, 7, 2, 4, 8}));
}

TEST(ShapeOps, ConcatRejectsMismatches) {
  Tensor a = Tensor::zeros({2, 3});
  EXPECT_THROW(ops::concat({}, 0), ValueError);
  EXPECT_THROW(ops::concat({a, Tensor::zeros({3, 2})}, 0), ShapeError);
  EXPECT_THROW(ops::concat({a, Tensor::zeros({2, 3, 1})}, 0), ShapeError);
  EXPECT_THROW(ops::concat({a, Tensor::zeros({2, 3}, DType::I64)}, 0), DTypeError);
  EXPECT_THROW(ops::concat({a, a}, 2), IndexError);
}

TEST(ShapeOps, ConcatGradientSplits) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::concat(in, 1); },
                         {leaf({2, 1, 3}, 7), leaf({2, 4, 3}, 8), leaf({2, 2, 3}, 9)});
}

TEST(ShapeOps, SumToUndoesBroadcasting) {
  Tensor g = Tensor::from_vector(iota(24), {2, 3, 4});
  Tensor r = ops::sum_to(g, {3, 1});
  ASSERT_EQ(r.shape(), (Shape{3, 1}));
  std::vector<float> v = r.to_float_vector();
  for (int64_t j = 0; j < 3; ++j) {
    float expect = 0;
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t k = 0; k < 4; ++k) expect += static_cast<float>((i * 3 + j) * 4 + k);
    EXPECT_EQ(v[j], expect);
  }
  EXPECT_EQ(ops::sum_to(g, {4}).to_float_vector(), (std::vector<float>{60, 66, 72, 78}));
  EXPECT_EQ(ops::sum_to(g, {}).item(), 276.0);
  EXPECT_EQ(ops::sum_to(g, {2, 3, 4}).id(), g.id());
  EXPECT_THROW(ops::sum_to(g, {3}), ShapeError);
  EXPECT_THROW(ops::sum_to(g, {1, 2, 3, 4}), ShapeError);
}

TEST(ShapeOps, SumToGradient) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::sum_to(in[0], {1, 4}); },
                         {leaf({2, 3, 4}, 10)});
}

}  // namespace
}  // namespace corelm
