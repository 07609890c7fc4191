#include <gtest/gtest.h>

#include "corelm/random.h"
#include "corelm/tensor.h"

using namespace corelm;

namespace {
Tensor iota(const Shape& s) {
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_vector(v, s);
}
}  // namespace

TEST(Storage, IsAlignedAndZeroed) {
  auto s = Storage::allocate(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % Storage::kAlignment, 0u);
  const unsigned char* p = static_cast<const unsigned char*>(s->data());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0);
}

TEST(Storage, UnbuiltDeviceIsAClearError) {
  try {
    Storage::allocate(16, Device{DeviceType::CUDA, 0});
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos);
  }
}

TEST(Tensor, FactoriesShapeStrides) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  Tensor f = Tensor::full({3}, 2.5);
  EXPECT_EQ(f.to_float_vector(), (std::vector<float>{2.5f, 2.5f, 2.5f}));
  Tensor scalar = Tensor::full({}, 7);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_DOUBLE_EQ(scalar.item(), 7.0);
}

TEST(Tensor, TransposeIsAViewAndContiguousCopies) {
  Tensor t = iota({2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.storage(), t.storage());
  EXPECT_EQ(tt.to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_EQ(c.to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  t.data<float>()[1] = 100;  // views see writes, copies do not
  EXPECT_EQ(tt.to_float_vector()[2], 100);
  EXPECT_EQ(c.to_float_vector()[2], 1);
}

TEST(Tensor, PermuteAndReshape) {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  // p[k][i][j] == t[i][j][k] == 12i + 4j + k
  std::vector<float> v = p.to_float_vector();
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) ASSERT_EQ(v[k * 6 + i * 3 + j], 12 * i + 4 * j + k);
  Tensor r = p.reshape({4, 6});  // non-contiguous: reshape copies
  EXPECT_EQ(r.to_float_vector(), v);
  Tensor w = t.view({6, -1});
  EXPECT_EQ(w.shape(), (Shape{6, 4}));
  EXPECT_EQ(w.storage(), t.storage());
}

TEST(Tensor, SliceSelectWithNegativesAndSteps) {
  Tensor t = iota({4, 5});
  Tensor s = t.slice(1, 1, -1, 2);  // columns 1, 3
  EXPECT_EQ(s.shape(), (Shape{4, 2}));
  EXPECT_EQ(s.to_float_vector(), (std::vector<float>{1, 3, 6, 8, 11, 13, 16, 18}));
  Tensor row = t.select(0, -1);
  EXPECT_EQ(row.to_float_vector(), (std::vector<float>{15, 16, 17, 18, 19}));
  Tensor empty = t.slice(0, 3, 1);
  EXPECT_EQ(empty.shape(), (Shape{0, 5}));
  EXPECT_EQ(t.slice(0, -100, 100).shape(), (Shape{4, 5}));  // python-style clamping
}

TEST(Tensor, UnsqueezeSqueezeExpand) {
  Tensor t = iota({3});
  Tensor u = t.unsqueeze(0);
  EXPECT_EQ(u.shape(), (Shape{1, 3}));
  Tensor e = u.expand({2, 3});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.to_float_vector(), (std::vector<float>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(u.squeeze(0).shape(), (Shape{3}));
  Tensor col = t.unsqueeze(1).expand({3, 4});
  EXPECT_EQ(col.to_float_vector()[5], 1);
}

TEST(Tensor, Broadcasting) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {5}), (Shape{5}));
  EXPECT_THROW(broadcast_shapes({2, 3}, {4}), ShapeError);
  try {
    broadcast_shapes({2, 3}, {4});
  } catch (const ShapeError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  }
}

TEST(Tensor, DtypeConversionRoundTrip) {
  Tensor t = Tensor::from_vector(std::vector<float>{1.0f, -2.5f, 3.140625f, 65504.0f}, {4});
  EXPECT_EQ(t.to(DType::BF16).to(DType::F32).to_float_vector()[2], 3.140625f);
  EXPECT_EQ(t.to(DType::F16).to(DType::F32).to_float_vector()[3], 65504.0f);
  Tensor i = t.to(DType::I32);
  EXPECT_EQ(i.to_int_vector(), (std::vector<int64_t>{1, -2, 3, 65504}));  // truncation toward zero
  Tensor big = Tensor::from_vector(std::vector<int64_t>{(int64_t(1) << 53) + 1}, {1});
  EXPECT_EQ(big.to(DType::I64).to_int_vector()[0], (int64_t(1) << 53) + 1);
  EXPECT_EQ(Tensor::arange(4, DType::I32).to_int_vector(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(Tensor::arange(4).to_float_vector(), (std::vector<float>{0, 1, 2, 3}));
  Tensor ints = Tensor::from_vector(std::vector<int32_t>{-3, 7}, {2});
  EXPECT_EQ(ints.to(DType::BF16).to_float_vector(), (std::vector<float>{-3, 7}));
  EXPECT_EQ(ints.to(DType::F16).to_float_vector(), (std::vector<float>{-3, 7}));
}

TEST(Tensor, CopyBroadcastsAndConverts) {
  Tensor dst = Tensor::zeros({2, 3}, DType::BF16);
  dst.copy_(Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_float_vector(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  Tensor t = iota({2, 3});
  t.transpose(0, 1).fill_(-1);
  EXPECT_EQ(t.to_float_vector(), std::vector<float>(6, -1));
}

TEST(Tensor, FromStorageIsBoundsChecked) {
  auto s = Storage::allocate(16);
  EXPECT_NO_THROW(Tensor::from_storage(s, {4}, DType::F32));
  EXPECT_THROW(Tensor::from_storage(s, {5}, DType::F32), IndexError);
  EXPECT_THROW(Tensor::from_storage(s, {2}, DType::F32, 3), IndexError);
}

TEST(Tensor, NegativeCases) {
  Tensor t = iota({2, 3});
  EXPECT_THROW(t.view({4, 2}), ShapeError);
  EXPECT_THROW(t.view({-1, -1}), ShapeError);
  EXPECT_THROW(t.transpose(0, 1).view({6}), ShapeError);  // non-contiguous view
  EXPECT_THROW(t.transpose(0, 2), IndexError);
  EXPECT_THROW(t.select(1, 3), IndexError);
  EXPECT_THROW(t.select(1, -4), IndexError);
  EXPECT_THROW(t.slice(2, 0, 1), IndexError);
  EXPECT_THROW(t.slice(0, 0, 1, 0), ValueError);
  EXPECT_THROW(t.permute({0, 0}), ShapeError);
  EXPECT_THROW(t.permute({0}), ShapeError);
  EXPECT_THROW(t.squeeze(0), ShapeError);
  EXPECT_THROW(t.expand({3, 3}), ShapeError);
  EXPECT_THROW(t.item(), ShapeError);
  EXPECT_THROW(t.data<int32_t>(), DTypeError);
  EXPECT_THROW(Tensor::zeros({2, -1}), ShapeError);
  EXPECT_THROW(Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}), ShapeError);
  EXPECT_THROW(Tensor().shape(), ValueError);
  EXPECT_THROW(Tensor::zeros({2}, DType::I64).set_requires_grad(true), Error);
}

TEST(Random, SeededAndPortable) {
  Generator a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(a.next_u64(), c.next_u64());
  Generator g(7);
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    float x = g.normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
  for (int i = 0; i < 1000; ++i) ASSERT_LT(g.below(7), 7u);
  auto st = g.state();
  float x1 = g.normal(), x2 = g.uniform();
  g.set_state(st);
  EXPECT_EQ(g.normal(), x1);
  EXPECT_EQ(g.uniform(), x2);
}
