// Embedding: row gather for i32/i64 ids of any shape, deterministic scatter-add gradient,
// and errors for wrong dtypes and out-of-range ids.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::randn;

TEST(Embedding, GathersRowsForI32AndI64Ids) {
  Tensor w = randn({5, 3}, 1);
  std::vector<float> vw = w.to_float_vector();
  const std::vector<int64_t> ids = {4, 0, 2, 2, 1, 4};
  Tensor ids64 = Tensor::from_vector(ids, {2, 3});
  Tensor ids32 = Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.end()), {2, 3});
  for (const Tensor& t : {ids64, ids32}) {
    Tensor y = ops::embedding(w, t);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
    std::vector<float> v = y.to_float_vector();
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(v[i * 3 + d], vw[ids[i] * 3 + d]);
  }
}

TEST(Embedding, StridedWeightAndIds) {
  Tensor w = ops::transpose(randn({3, 5}, 2), 0, 1);  // [5, 3], strided
  Tensor ids = ops::transpose(Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0}, {2, 3}), 0, 1);
  EXPECT_EQ(ops::embedding(w, ids).to_float_vector(), ops::embedding(w.clone(), ids.clone()).to_float_vector());
}

TEST(Embedding, ZeroDimIds) {
  Tensor w = randn({4, 2}, 3);
  Tensor y = ops::embedding(w, Tensor::from_vector(std::vector<int64_t>{3}, {}));
  EXPECT_EQ(y.shape(), (Shape{2}));
  std::vector<float> vw = w.to_float_vector();
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{vw[6], vw[7]}));
}

TEST(Embedding, BackwardCountsRepeatedIds) {
  Tensor w = randn({4, 2}, 4);
  w.set_requires_grad(true);
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{1, 3, 1, 1}, {4});
  ops::sum(ops::embedding(w, ids)).backward();
  EXPECT_EQ(w.grad().shape(), (Shape{4, 2}));
  EXPECT_EQ(w.grad().to_float_vector(), (std::vector<float>{0, 0, 3, 3, 0, 0, 1, 1}));
}

TEST(Embedding, Gradient) {
  Tensor w = randn({6, 4}, 5);
  w.set_requires_grad(true);
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{5, 0, 5, 2, 3, 0}, {3, 2});
  expect_gradients_match([ids](const std::vector<Tensor>& in) { return ops::embedding(in[0], ids); },
                         {w});
}

TEST(Embedding, BackwardIsThreadInvariant) {
  Tensor w = randn({50, 300}, 6);
  w.set_requires_grad(true);
  Generator gen(7);
  std::vector<int64_t> idv(400);
  for (auto& id : idv) id = static_cast<int64_t>(gen.below(50));
  Tensor ids = Tensor::from_vector(idv, {400});
  Tensor weights = randn({400, 300}, 8);
  auto grad_with = [&](int threads) {
    set_num_threads(threads);
    w.zero_grad();
    ops::sum(ops::mul(ops::embedding(w, ids), weights)).backward();
    return w.grad().to_float_vector();
  };
  std::vector<float> one = grad_with(1), two = grad_with(2);
  set_num_threads(1);
  EXPECT_EQ(one, two);
}

TEST(Embedding, RejectsNonIntegerIds) {
  Tensor w = randn({4, 2}, 9);
  EXPECT_THROW(ops::embedding(w, Tensor::zeros({3})), DTypeError);
  EXPECT_THROW(ops::embedding(w, Tensor::zeros({3}, DType::U8)), DTypeError);
  EXPECT_THROW(ops::embedding(Tensor::zeros({4, 2}, DType::BF16), Tensor::zeros({3}, DType::I64)),
               DTypeError);
  EXPECT_THROW(ops::embedding(Tensor::zeros({4}), Tensor::zeros({3}, DType::I64)), ShapeError);
}

TEST(Embedding, OutOfRangeIdsNameTheIdAndVocab) {
  Tensor w = randn({4, 2}, 10);
  for (int64_t bad : {int64_t{4}, int64_t{-1}, int64_t{1000}}) {
    try {
      ops::embedding(w, Tensor::from_vector(std::vector<int64_t>{0, bad}, {2}));
      ADD_FAILURE() << "id " << bad << " accepted";
    } catch (const IndexError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("V = 4"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(ops::embedding(w, Tensor::from_vector(std::vector<int32_t>{7}, {1})), IndexError);
}

}  // namespace
}  // namespace corelm
