// matmul / linear / the reference GEMM: values against a naive triple loop written here,
// transpose flags, broadcast batches, strided inputs, gradients, thread invariance, errors.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/reference/gemm.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::leaf;
using testing::randn;

// Naive matmul of 2-D matrices given in logical order, in double.
std::vector<double> naive_2d(const std::vector<float>& a, const std::vector<float>& b, int64_t M,
                             int64_t N, int64_t K, bool ta, bool tb) {
  std::vector<double> c(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) {
        const double av = ta ? a[k * M + i] : a[i * K + k];
        const double bv = tb ? b[j * K + k] : b[k * N + j];
        c[i * N + j] += av * bv;
      }
  return c;
}

// Full expectation for batched operands: broadcasts the batch dims with expand (a raw view),
// then runs the naive 2-D product per batch item.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(ba, bb);
  Shape ea = batch, eb = batch;
  ea.insert(ea.end(), a.shape().end() - 2, a.shape().end());
  eb.insert(eb.end(), b.shape().end() - 2, b.shape().end());
  std::vector<float> va = a.expand(ea).to_float_vector(), vb = b.expand(eb).to_float_vector();
  const int64_t M = ta ? a.size(-1) : a.size(-2), K = ta ? a.size(-2) : a.size(-1);
  const int64_t N = tb ? b.size(-2) : b.size(-1);
  std::vector<double> out;
  for (int64_t item = 0; item < shape_numel(batch); ++item) {
    std::vector<float> ai(va.begin() + item * M * K, va.begin() + (item + 1) * M * K);
    std::vector<float> bi(vb.begin() + item * K * N, vb.begin() + (item + 1) * K * N);
    std::vector<double> ci = naive_2d(ai, bi, M, N, K, ta, tb);
    out.insert(out.end(), ci.begin(), ci.end());
  }
  return out;
}

void expect_matches_naive(const Tensor& a, const Tensor& b, bool ta, bool tb, const Shape& shape) {
  SCOPED_TRACE(shape_str(a.shape()) + (ta ? "^T" : "") + " @ " + shape_str(b.shape()) + (tb ? "^T" : ""));
  Tensor c = ops::matmul(a, b, ta, tb);
  ASSERT_EQ(c.shape(), shape);
  std::vector<float> v = c.to_float_vector();
  std::vector<double> expect = naive_matmul(a, b, ta, tb);
  ASSERT_EQ(v.size(), expect.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expect[i], 1e-4) << "at " << i;
}

TEST(Matmul, HandComputed2x2) {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector(std::vector<float>{5, 6, 7, 8}, {2, 2});
  EXPECT_EQ(ops::matmul(a, b).to_float_vector(), (std::vector<float>{19, 22, 43, 50}));
  EXPECT_EQ(ops::matmul(a, b, true, false).to_float_vector(), (std::vector<float>{26, 30, 38, 44}));
  EXPECT_EQ(ops::matmul(a, b, false, true).to_float_vector(), (std::vector<float>{17, 23, 39, 53}));
  EXPECT_EQ(ops::matmul(a, b, true, true).to_float_vector(), (std::vector<float>{23, 31, 34, 46}));
}

TEST(Matmul, AllTransposeFlags) {
  const int64_t M = 5, N = 7;
  for (int64_t K : {3, 19}) {  // below and across the kernel's 8-wide dot-product blocks
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      Tensor a = randn(ta ? Shape{K, M} : Shape{M, K}, 1 + flags);
      Tensor b = randn(tb ? Shape{N, K} : Shape{K, N}, 11 + flags);
      expect_matches_naive(a, b, ta, tb, {M, N});
    }
  }
}

TEST(Matmul, BatchedAndBroadcastBatches) {
  expect_matches_naive(randn({4, 3, 5}, 1), randn({4, 5, 2}, 2), false, false, {4, 3, 2});
  expect_matches_naive(randn({2, 1, 3, 5}, 3), randn({4, 5, 2}, 4), false, false, {2, 4, 3, 2});
  expect_matches_naive(randn({3, 5}, 5), randn({2, 5, 4}, 6), false, false, {2, 3, 4});
  // b without batch dims: the folded single-GEMM path.
  expect_matches_naive(randn({2, 3, 3, 5}, 7), randn({4, 5}, 8), false, true, {2, 3, 3, 4});
  expect_matches_naive(randn({2, 5, 3}, 9), randn({5, 4}, 10), true, false, {2, 3, 4});
  expect_matches_naive(randn({2, 1, 5, 3}, 11), randn({3, 4, 5}, 12), true, true, {2, 3, 3, 4});
}

TEST(Matmul, StridedInputsMatchTheirCopies) {
  Tensor a = ops::transpose(randn({2, 5, 3}, 13), 1, 2);  // [2, 3, 5]
  Tensor b = ops::slice(randn({2, 5, 8}, 14), 2, 0, 8, 2);  // [2, 5, 4]
  EXPECT_EQ(ops::matmul(a, b).to_float_vector(), ops::matmul(a.clone(), b.clone()).to_float_vector());
  expect_matches_naive(a, b, false, false, {2, 3, 4});
}

TEST(Matmul, EmptyInnerDimGivesZeros) {
  Tensor c = ops::matmul(Tensor::zeros({2, 0}), Tensor::zeros({0, 3}));
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  for (float v : c.to_float_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(Matmul, GemmKernelHonoursAlphaBetaAndLeadingDims) {
  // A is the left 2x3 block of a 2x4 buffer (lda 4); C is a 2x2 block of a 2x3 buffer (ldc 3).
  std::vector<float> A = {1, 2, 3, -1, 4, 5, 6, -1};
  std::vector<float> B = {1, 0, 0, 1, 1, 1};  // 3x2
  std::vector<float> C = {1, 1, 9, 1, 1, 9};
  kernels::reference::gemm(false, false, 2, 2, 3, 2.0f, A.data(), 4, B.data(), 2, 0.5f, C.data(), 3);
  EXPECT_EQ(C, (std::vector<float>{8.5f, 10.5f, 9, 20.5f, 22.5f, 9}));
  // beta == 0 overwrites, even NaN.
  std::vector<float> D = {NAN, NAN, NAN, NAN};
  kernels::reference::gemm(false, false, 2, 2, 3, 1.0f, A.data(), 4, B.data(), 2, 0.0f, D.data(), 2);
  EXPECT_EQ(D, (std::vector<float>{4, 5, 10, 11}));
}

TEST(Matmul, Gradients) {
  for (int flags = 0; flags < 4; ++flags) {
    const bool ta = flags & 1, tb = flags & 2;
    SCOPED_TRACE(flags);
    auto fn = [ta, tb](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1], ta, tb); };
    expect_gradients_match(fn, {leaf(ta ? Shape{3, 2} : Shape{2, 3}, 20 + flags),
                                leaf(tb ? Shape{4, 3} : Shape{3, 4}, 30 + flags)});
    // Broadcast batches on both sides: gradients are summed over the broadcast dims.
    expect_gradients_match(fn, {leaf(ta ? Shape{2, 1, 3, 2} : Shape{2, 1, 2, 3}, 40 + flags),
                                leaf(tb ? Shape{3, 4, 3} : Shape{3, 3, 4}, 50 + flags)});
    // Batched a with a plain matrix b (the folded path).
    expect_gradients_match(fn, {leaf(ta ? Shape{2, 3, 2} : Shape{2, 2, 3}, 60 + flags),
                                leaf(tb ? Shape{4, 3} : Shape{3, 4}, 70 + flags)});
  }
}

TEST(Matmul, ThreadCountDoesNotChangeResults) {
  Tensor a = randn({3, 67, 96}, 80), b = randn({96, 81}, 81), bt = randn({3, 81, 96}, 82);
  set_num_threads(1);
  std::vector<float> one = ops::matmul(a, b).to_float_vector();
  std::vector<float> one_t = ops::matmul(a, bt, false, true).to_float_vector();
  set_num_threads(2);
  std::vector<float> two = ops::matmul(a, b).to_float_vector();
  std::vector<float> two_t = ops::matmul(a, bt, false, true).to_float_vector();
  set_num_threads(1);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one_t, two_t);
}

TEST(Matmul, RejectsBadOperands) {
  try {
    ops::matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}));
    ADD_FAILURE() << "inner dims 3 vs 4 accepted";
  } catch (const ShapeError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::matmul(Tensor::zeros({3}), Tensor::zeros({3, 2})), ShapeError);
  EXPECT_THROW(ops::matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})), ShapeError);
  EXPECT_THROW(ops::matmul(Tensor::zeros({2, 3}), Tensor::zeros({2, 3}), false, false), ShapeError);
  EXPECT_NO_THROW(ops::matmul(Tensor::zeros({2, 3}), Tensor::zeros({2, 3}), false, true));
  EXPECT_THROW(ops::matmul(Tensor::zeros({2, 3}, DType::BF16), Tensor::zeros({3, 2})), DTypeError);
}

TEST(Linear, MatchesMatmulPlusBias) {
  Tensor x = randn({2, 3, 4}, 90), w = randn({5, 4}, 91), bias = randn({5}, 92);
  Tensor y = ops::linear(x, w, bias);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  std::vector<float> vx = x.to_float_vector(), vw = w.to_float_vector(), vb = bias.to_float_vector();
  std::vector<float> vy = y.to_float_vector();
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t o = 0; o < 5; ++o) {
      double e = vb[o];
      for (int64_t i = 0; i < 4; ++i) e += static_cast<double>(vx[r * 4 + i]) * vw[o * 4 + i];
      EXPECT_NEAR(vy[r * 5 + o], e, 1e-4);
    }
  EXPECT_EQ(ops::linear(x, w).shape(), (Shape{2, 3, 5}));
  Tensor y1 = ops::linear(randn({4}, 93), w, bias);
  EXPECT_EQ(y1.shape(), (Shape{5}));
}

TEST(Linear, Gradients) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); },
                         {leaf({2, 3, 4}, 94), leaf({5, 4}, 95), leaf({5}, 96)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1]); },
                         {leaf({4}, 97), leaf({2, 4}, 98)});
}

TEST(Linear, RejectsMismatchedShapes) {
  Tensor x = Tensor::zeros({2, 4});
  EXPECT_THROW(ops::linear(x, Tensor::zeros({5, 3})), ShapeError);
  EXPECT_THROW(ops::linear(x, Tensor::zeros({5, 4, 1})), ShapeError);
  EXPECT_THROW(ops::linear(x, Tensor::zeros({5, 4}), Tensor::zeros({4})), ShapeError);
  EXPECT_THROW(ops::linear(x, Tensor::zeros({5, 4}), Tensor::zeros({5}, DType::I32)), DTypeError);
}

}  // namespace
}  // namespace corelm
