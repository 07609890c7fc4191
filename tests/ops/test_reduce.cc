// Sum / mean: values against loops over the index space, dim handling, gradients, errors.
#include <gtest/gtest.h>

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

// Sums x [A, B, C] over the dims flagged in `reduce`, in double, for comparison.
std::vector<double> naive_sum(const Tensor& x, bool r0, bool r1, bool r2) {
  std::vector<float> v = x.to_float_vector();
  const int64_t A = x.size(0), B = x.size(1), C = x.size(2);
  const int64_t oa = r0 ? 1 : A, ob = r1 ? 1 : B, oc = r2 ? 1 : C;
  std::vector<double> out(static_cast<size_t>(oa * ob * oc), 0.0);
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        out[((r0 ? 0 : a) * ob + (r1 ? 0 : b)) * oc + (r2 ? 0 : c)] += v[(a * B + b) * C + c];
  return out;
}

void expect_close(const Tensor& y, const std::vector<double>& expect, double scale = 1.0) {
  std::vector<float> v = y.to_float_vector();
  ASSERT_EQ(v.size(), expect.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expect[i] * scale, 1e-5) << "at " << i;
}

TEST(Reduce, SumOverEachDimSet) {
  Tensor x = randn({3, 4, 5}, 1);
  for (int mask = 1; mask < 8; ++mask) {
    const bool r0 = mask & 1, r1 = mask & 2, r2 = mask & 4;
    std::vector<int64_t> dims;
    if (r0) dims.push_back(0);
    if (r1) dims.push_back(1);
    if (r2) dims.push_back(2);
    SCOPED_TRACE(shape_str(dims));
    Tensor keep = ops::sum(x, dims, /*keepdim=*/true);
    EXPECT_EQ(keep.shape(), (Shape{r0 ? 1 : 3, r1 ? 1 : 4, r2 ? 1 : 5}));
    expect_close(keep, naive_sum(x, r0, r1, r2));
    Tensor drop = ops::sum(x, dims);
    EXPECT_EQ(drop.numel(), keep.numel());
    EXPECT_EQ(drop.dim(), 3 - static_cast<int64_t>(dims.size()));
    expect_close(drop, naive_sum(x, r0, r1, r2));
  }
}

TEST(Reduce, NegativeAndUnorderedDims) {
  Tensor x = randn({3, 4, 5}, 2);
  EXPECT_EQ(ops::sum(x, {-1}).shape(), (Shape{3, 4}));
  expect_close(ops::sum(x, {-1}), naive_sum(x, false, false, true));
  expect_close(ops::sum(x, {2, -3}), naive_sum(x, true, false, true));
}

TEST(Reduce, AllElementsGiveZeroDimTensor) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor s = ops::sum(x);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.item(), 21.0);
  Tensor m = ops::mean(x);
  EXPECT_EQ(m.shape(), Shape{});
  EXPECT_FLOAT_EQ(static_cast<float>(m.item()), 3.5f);
  EXPECT_EQ(ops::sum(s).item(), 21.0);  // a 0-dim input is its own sum
}

TEST(Reduce, MeanDividesByReducedCount) {
  Tensor x = randn({3, 4, 5}, 3);
  expect_close(ops::mean(x, {0, 2}), naive_sum(x, true, false, true), 1.0 / 15);
  expect_close(ops::mean(x, {1}, true), naive_sum(x, false, true, false), 1.0 / 4);
}

TEST(Reduce, EmptyDimListReducesNothing) {
  Tensor x = randn({2, 3}, 4);
  Tensor y = ops::sum(x, {});
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(y.to_float_vector(), x.to_float_vector());
}

TEST(Reduce, NonContiguousInput) {
  Tensor x = ops::permute(randn({5, 3, 4}, 5), {1, 2, 0});  // [3, 4, 5], strided
  expect_close(ops::sum(x, {1}), naive_sum(x, false, true, false));
  expect_close(ops::sum(x, {0, 2}), naive_sum(x, true, false, true));
}

TEST(Reduce, Gradients) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::sum(in[0], {1}); },
                         {leaf({3, 4, 5}, 6)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::sum(in[0], {0, 2}, true); },
                         {leaf({3, 4, 5}, 7)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::mean(in[0], {-1}); },
                         {leaf({3, 4, 5}, 8)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::mean(in[0]); },
                         {leaf({3, 4}, 9)});
  expect_gradients_match([](const std::vector<Tensor>& in) {
    return ops::sum(ops::transpose(in[0], 0, 1), {0});
  }, {leaf({3, 4}, 10)});
}

TEST(Reduce, MeanGradientIsUniform) {
  Tensor x = leaf({2, 5}, 11);
  ops::mean(x).backward();
  for (float g : x.grad().to_float_vector()) EXPECT_FLOAT_EQ(g, 0.1f);
}

TEST(Reduce, RejectsBadDimsAndDtypes) {
  Tensor x = Tensor::zeros({2, 3});
  EXPECT_THROW(ops::sum(x, {2}), IndexError);
  EXPECT_THROW(ops::sum(x, {-3}), IndexError);
  EXPECT_THROW(ops::mean(x, {1, -1}), ValueError);
  EXPECT_THROW(ops::sum(Tensor::zeros({2, 3}, DType::I32)), DTypeError);
  EXPECT_THROW(ops::mean(Tensor::zeros({2}, DType::I64), {0}), DTypeError);
}

TEST(Reduce, ThreadCountDoesNotChangeResults) {
  Tensor x = randn({37, 129, 11}, 12);
  set_num_threads(1);
  std::vector<float> one = ops::sum(x, {1}).to_float_vector();
  std::vector<float> one_all = ops::sum(x, {0, 2}).to_float_vector();
  set_num_threads(2);
  std::vector<float> two = ops::sum(x, {1}).to_float_vector();
  std::vector<float> two_all = ops::sum(x, {0, 2}).to_float_vector();
  set_num_threads(1);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one_all, two_all);
}

}  // namespace
}  // namespace corelm
