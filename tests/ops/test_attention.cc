// Causal attention with GQA: values against explicit loops, KV-cache and GQA properties,
// gradients, thread invariance, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
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

// Explicit loops in double: scores, causal mask, softmax, weighted sum.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), group = Hq / Hkv;
  auto qv = q.to_float_vector(), kv = k.to_float_vector(), vv = v.to_float_vector();
  std::vector<double> out(B * Hq * T * D, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t kvh = h / group;
        std::vector<double> scores(S, -INFINITY);
        double m = -INFINITY;
        for (int64_t s = 0; s <= S - T + t; ++s) {
          double dotp = 0.0;
          for (int64_t i = 0; i < D; ++i)
            dotp += double(qv[((b * Hq + h) * T + t) * D + i]) * kv[((b * Hkv + kvh) * S + s) * D + i];
          scores[s] = dotp * scale;
          m = std::max(m, scores[s]);
        }
        double total = 0.0;
        for (int64_t s = 0; s < S; ++s) total += std::exp(scores[s] - m);
        for (int64_t s = 0; s < S; ++s) {
          const double p = std::exp(scores[s] - m) / total;
          for (int64_t i = 0; i < D; ++i)
            out[((b * Hq + h) * T + t) * D + i] += p * vv[((b * Hkv + kvh) * S + s) * D + i];
        }
      }
  return out;
}

// k [B, Hkv, S, D] -> [B, Hkv * group, S, D] with each kv head repeated `group` times.
Tensor repeat_kv(const Tensor& k, int64_t group) {
  const int64_t B = k.size(0), H = k.size(1), S = k.size(2), D = k.size(3);
  auto src = k.to_float_vector();
  std::vector<float> dst;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H * group; ++h) {
      const float* head = src.data() + (b * H + h / group) * S * D;
      dst.insert(dst.end(), head, head + S * D);
    }
  return Tensor::from_vector(dst, {B, H * group, S, D});
}

struct Grads {
  std::vector<float> out, dq, dk, dv;
  bool operator==(const Grads&) const = default;
};

Grads run_with_grads(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& grad_out) {
  Tensor q = q0.clone(), k = k0.clone(), v = v0.clone();
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  Tensor out = ops::causal_attention(q, k, v);
  out.backward(grad_out);
  return {out.to_float_vector(), q.grad().to_float_vector(), k.grad().to_float_vector(),
          v.grad().to_float_vector()};
}

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(CausalAttentionOp, MatchesNaive) {
  struct Case { int64_t B, Hq, Hkv, T, S, D; std::optional<float> scale; };
  for (const Case& c : {Case{1, 2, 2, 4, 4, 8, std::nullopt}, Case{2, 4, 2, 3, 5, 4, std::nullopt},
                        Case{1, 6, 1, 1, 7, 4, std::nullopt}, Case{2, 2, 1, 5, 5, 6, 0.3f}}) {
    SCOPED_TRACE(::testing::Message() << "Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " S " << c.S);
    Tensor q = random_tensor({c.B, c.Hq, c.T, c.D}, 1), k = random_tensor({c.B, c.Hkv, c.S, c.D}, 2),
           v = random_tensor({c.B, c.Hkv, c.S, c.D}, 3);
    Tensor out = ops::causal_attention(q, k, v, c.scale);
    EXPECT_EQ(out.shape(), q.shape());
    const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(double(c.D));
    expect_near(out.to_float_vector(), naive_attention(q, k, v, scale), 1e-5);
  }
}

TEST(CausalAttentionOp, FirstQueryCopiesFirstValue) {
  Tensor q = random_tensor({1, 1, 3, 4}, 4), k = random_tensor({1, 1, 3, 4}, 5), v = random_tensor({1, 1, 3, 4}, 6);
  auto out = ops::causal_attention(q, k, v).to_float_vector();
  auto vv = v.to_float_vector();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], vv[i], 1e-6);
}

TEST(CausalAttentionOp, SingleQueryEqualsLastRowOfFullAttention) {
  const int64_t S = 6;
  Tensor q = random_tensor({2, 4, S, 8}, 7), k = random_tensor({2, 2, S, 8}, 8), v = random_tensor({2, 2, S, 8}, 9);
  Tensor full = ops::causal_attention(q, k, v);
  for (int64_t T : {1, 3}) {
    Tensor part = ops::causal_attention(q.slice(2, S - T, S), k, v);
    auto want = full.slice(2, S - T, S).contiguous().to_float_vector();
    auto got = part.to_float_vector();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);
  }
}

TEST(CausalAttentionOp, GqaEqualsMhaWithRepeatedKv) {
  const int64_t group = 3;
  Tensor q = random_tensor({2, 6, 4, 4}, 10), k = random_tensor({2, 2, 5, 4}, 11), v = random_tensor({2, 2, 5, 4}, 12);
  Tensor g = random_tensor({2, 6, 4, 4}, 13);
  Grads gqa = run_with_grads(q, k, v, g);
  Grads mha = run_with_grads(q, repeat_kv(k, group), repeat_kv(v, group), g);
  expect_near(gqa.out, std::vector<double>(mha.out.begin(), mha.out.end()), 1e-6);
  expect_near(gqa.dq, std::vector<double>(mha.dq.begin(), mha.dq.end()), 1e-6);
  // The kv-head gradient is the sum over the query heads that share it.
  for (auto [gqa_grad, mha_grad] : {std::pair{&gqa.dk, &mha.dk}, std::pair{&gqa.dv, &mha.dv}}) {
    const int64_t per_head = 5 * 4;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t kvh = 0; kvh < 2; ++kvh)
        for (int64_t i = 0; i < per_head; ++i) {
          double total = 0.0;
          for (int64_t r = 0; r < group; ++r) total += (*mha_grad)[((b * 6) + kvh * group + r) * per_head + i];
          EXPECT_NEAR((*gqa_grad)[(b * 2 + kvh) * per_head + i], total, 1e-5);
        }
  }
}

TEST(CausalAttentionOp, Gradients) {
  Tensor q = random_tensor({1, 4, 3, 4}, 14), k = random_tensor({1, 2, 5, 4}, 15), v = random_tensor({1, 2, 5, 4}, 16);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::causal_attention(in[0], in[1], in[2]); }, {leaf(q), leaf(k), leaf(v)});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::causal_attention(in[0], in[1], in[2], 0.7f); },
      {leaf(random_tensor({2, 2, 4, 3}, 17)), leaf(random_tensor({2, 2, 4, 3}, 18)),
       leaf(random_tensor({2, 2, 4, 3}, 19))});
}

TEST(CausalAttentionOp, NonContiguousInputs) {
  // [B, T, H, D] buffers viewed as [B, H, T, D], as a model produces them after a projection.
  Tensor q = random_tensor({1, 4, 2, 8}, 20).transpose(1, 2), k = random_tensor({1, 4, 2, 8}, 21).transpose(1, 2),
         v = random_tensor({1, 4, 2, 8}, 22).transpose(1, 2);
  EXPECT_EQ(ops::causal_attention(q, k, v).to_float_vector(),
            ops::causal_attention(q.contiguous(), k.contiguous(), v.contiguous()).to_float_vector());
}

TEST(CausalAttentionOp, ThreadCountInvariant) {
  Tensor q = random_tensor({2, 4, 9, 8}, 23), k = random_tensor({2, 2, 11, 8}, 24), v = random_tensor({2, 2, 11, 8}, 25);
  Tensor g = random_tensor({2, 4, 9, 8}, 26);
  set_num_threads(1);
  Grads one = run_with_grads(q, k, v, g);
  set_num_threads(2);
  Grads two = run_with_grads(q, k, v, g);
  set_num_threads(1);
  EXPECT_TRUE(one == two);
}

TEST(CausalAttentionOp, Errors) {
  auto z = [](const Shape& s) { return Tensor::zeros(s); };
  EXPECT_THROW(ops::causal_attention(z({1, 3, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4})), ShapeError);  // Hq % Hkv
  EXPECT_THROW(ops::causal_attention(z({2, 2, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4})), ShapeError);  // B
  EXPECT_THROW(ops::causal_attention(z({1, 2, 2, 4}), z({1, 2, 2, 8}), z({1, 2, 2, 8})), ShapeError);  // D
  EXPECT_THROW(ops::causal_attention(z({1, 2, 3, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4})), ShapeError);  // S < T
  EXPECT_THROW(ops::causal_attention(z({1, 2, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 3, 4})), ShapeError);  // k vs v
  EXPECT_THROW(ops::causal_attention(z({2, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4})), ShapeError);     // rank
  EXPECT_THROW(ops::causal_attention(z({1, 2, 2, 4}), Tensor::zeros({1, 2, 2, 4}, DType::I32), z({1, 2, 2, 4})),
               DTypeError);
  try {
    ops::causal_attention(z({1, 3, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4}));
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 3, 2, 4]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace corelm
