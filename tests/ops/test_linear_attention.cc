// ops::linear_attention (log-decay linear attention): the op on every ISA path against explicit
// loops, finite-difference gradients (log_decay included), batch and thread invariance, document
// isolation, the recurrent decode step (ops/linear_attention_step.h) against the op, prefill in
// two parts, and the errors. The chunked kernel against the recurrence on many shapes is
// test_linear_attention_forms.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/thread_pool.h"
#include "ops/linear_attention_step.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::leaf;
using testing::random_tensor;

// log_decay [H, ds] with entries in [lo, hi] (both <= 0).
Tensor decays(int64_t H, int64_t ds, uint64_t seed, float lo = -3.0f, float hi = -0.01f) {
  Generator gen(seed);
  return Tensor::rand({H, ds}, gen, lo, hi);
}

// Explicit loops in double: the recurrence written out from the contract in ops.h.
std::vector<double> naive(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a,
                          const std::vector<int64_t>& docs, float scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), ds = q.size(3), Hkv = k.size(1), dv = v.size(3);
  auto qv = q.to_float_vector(), kv = k.to_float_vector(), vv = v.to_float_vector(), av = a.to_float_vector();
  std::vector<double> out(B * Hq * T * dv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      std::vector<double> S(ds * dv, 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const bool reset = !docs.empty() && t > 0 && docs[b * T + t] != docs[b * T + t - 1];
        for (int64_t c = 0; c < ds; ++c)
          for (int64_t j = 0; j < dv; ++j)
            S[c * dv + j] = (reset ? 0.0 : std::exp(double(av[g * ds + c])) * S[c * dv + j]) +
                            double(kv[((b * Hkv + g) * T + t) * ds + c]) * vv[((b * Hkv + g) * T + t) * dv + j];
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < ds; ++c) acc += double(qv[((b * Hq + h) * T + t) * ds + c]) * S[c * dv + j];
          out[((b * Hq + h) * T + t) * dv + j] = scale * acc;
        }
      }
    }
  return out;
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double m = 0, r = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    m = std::max(m, std::fabs(got[i] - want[i]));
    r = std::max(r, std::fabs(want[i]));
  }
  return r > 0 ? m / r : m;
}
double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  return max_rel(got, std::vector<double>(want.begin(), want.end()));
}

struct Grads {
  std::vector<float> out, dq, dk, dv, da;
  bool operator==(const Grads&) const = default;
};

Grads run_with_grads(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& a0, const Tensor& docs,
                     const Tensor& go) {
  Tensor q = leaf(q0.clone()), k = leaf(k0.clone()), v = leaf(v0.clone()), a = leaf(a0.clone());
  Tensor out = ops::linear_attention(q, k, v, a, docs);
  out.backward(go);
  return {out.to_float_vector(), q.grad().to_float_vector(), k.grad().to_float_vector(), v.grad().to_float_vector(),
          a.grad().to_float_vector()};
}

TEST(LinearAttentionOp, MatchesNaiveOnEveryPath) {
  const int64_t B = 2, Hq = 4, Hkv = 2, T = 150, ds = 8, dv = 6;
  Tensor q = random_tensor({B, Hq, T, ds}, 1, 0.5f), k = random_tensor({B, Hkv, T, ds}, 2, 0.5f),
         v = random_tensor({B, Hkv, T, dv}, 3), a = decays(Hkv, ds, 4);
  std::vector<int64_t> docs(B * T);
  for (int64_t t = 0; t < T; ++t) docs[t] = t < 70 ? 0 : (t < 71 ? 1 : 2), docs[T + t] = 5;
  const Tensor doc_ids = Tensor::from_vector(docs, {B, T});
  for (Isa isa : supported_isas()) {
    ScopedIsa scope(isa);
    SCOPED_TRACE(isa_name(isa));
    EXPECT_LE(max_rel(ops::linear_attention(q, k, v, a).to_float_vector(), naive(q, k, v, a, {}, 1.0f)), 2e-6);
    EXPECT_LE(max_rel(ops::linear_attention(q, k, v, a, doc_ids, Tensor(), nullptr, 0.3f).to_float_vector(),
                      naive(q, k, v, a, docs, 0.3f)),
              2e-6);
  }
}

TEST(LinearAttentionOp, DocumentsDoNotSeeEachOther) {
  // Two documents packed in one row give the outputs of each document run alone.
  const int64_t T1 = 30, T2 = 50, ds = 8, dv = 4;
  Tensor q = random_tensor({1, 2, T1 + T2, ds}, 5), k = random_tensor({1, 1, T1 + T2, ds}, 6),
         v = random_tensor({1, 1, T1 + T2, dv}, 7), a = decays(1, ds, 8, -0.05f, 0.0f);
  std::vector<int32_t> docs(T1 + T2, 3);
  std::fill(docs.begin() + T1, docs.end(), 4);
  const auto packed = ops::linear_attention(q, k, v, a, Tensor::from_vector(docs, {1, T1 + T2})).to_float_vector();
  const auto second = ops::linear_attention(q.slice(2, T1, T1 + T2), k.slice(2, T1, T1 + T2),
                                            v.slice(2, T1, T1 + T2), a).to_float_vector();
  const auto together = ops::linear_attention(q, k, v, a).slice(2, T1, T1 + T2).contiguous().to_float_vector();
  std::vector<float> packed_second;
  for (int64_t h = 0; h < 2; ++h)
    packed_second.insert(packed_second.end(), packed.begin() + (h * (T1 + T2) + T1) * dv,
                         packed.begin() + (h + 1) * (T1 + T2) * dv);
  EXPECT_LE(max_rel(packed_second, second), 2e-6);
  EXPECT_GT(max_rel(together, second), 1e-2);  // without doc_ids the first document leaks in
}

TEST(LinearAttentionOp, Gradients) {
  // T = 70 crosses the fast path's 64-position chunk; a document boundary at 40, an initial state.
  const int64_t T = 70;
  std::vector<int64_t> docs(T, 0);
  std::fill(docs.begin() + 40, docs.end(), 1);
  const Tensor doc_ids = Tensor::from_vector(docs, {1, T});
  const Tensor init = random_tensor({1, 1, 3, 2}, 9);
  for (Isa isa : supported_isas()) {
    ScopedIsa scope(isa);
    SCOPED_TRACE(isa_name(isa));
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) {
          return ops::linear_attention(in[0], in[1], in[2], in[3], doc_ids, init, nullptr, 0.7f);
        },
        {leaf(random_tensor({1, 2, T, 3}, 10, 0.5f)), leaf(random_tensor({1, 1, T, 3}, 11, 0.5f)),
         leaf(random_tensor({1, 1, T, 2}, 12)), leaf(decays(1, 3, 13, -1.0f, -0.05f))},
        1e-3, 1e-2);
  }
}

TEST(LinearAttentionOp, BatchAndThreadInvariant) {
  const int64_t B = 3, Hq = 2, Hkv = 1, T = 130, ds = 16, dv = 8;
  Tensor q = random_tensor({B, Hq, T, ds}, 14, 0.5f), k = random_tensor({B, Hkv, T, ds}, 15, 0.5f),
         v = random_tensor({B, Hkv, T, dv}, 16), a = decays(Hkv, ds, 17), go = random_tensor({B, Hq, T, dv}, 18);
  std::vector<int64_t> docs(B * T);
  for (int64_t i = 0; i < B * T; ++i) docs[i] = (i % T) / 45;
  const Tensor doc_ids = Tensor::from_vector(docs, {B, T});
  for (Isa isa : supported_isas()) {
    ScopedIsa scope(isa);
    SCOPED_TRACE(isa_name(isa));
    set_num_threads(1);
    const Grads one = run_with_grads(q, k, v, a, doc_ids, go);
    set_num_threads(3);
    const Grads three = run_with_grads(q, k, v, a, doc_ids, go);
    set_num_threads(1);
    EXPECT_TRUE(one == three) << "results depend on the thread count";
    // Row 1 alone: the same bits for its output and its q, k, v gradients.
    auto row = [](const Tensor& x) { return x.slice(0, 1, 2).contiguous(); };
    const Grads alone = run_with_grads(row(q), row(k), row(v), a, row(doc_ids), row(go));
    auto row_of = [&](const std::vector<float>& x) {
      const size_t n = x.size() / B;
      return std::vector<float>(x.begin() + n, x.begin() + 2 * n);
    };
    EXPECT_EQ(alone.out, row_of(one.out));
    EXPECT_EQ(alone.dq, row_of(one.dq));
    EXPECT_EQ(alone.dk, row_of(one.dk));
    EXPECT_EQ(alone.dv, row_of(one.dv));
  }
}

TEST(LinearAttentionStep, SteppingEqualsTheOpAndItsFinalState) {
  const int64_t Hq = 2, Hkv = 1, T = 200, ds = 32, dv = 32;
  Tensor q = random_tensor({1, Hq, T, ds}, 19, 0.3f), k = random_tensor({1, Hkv, T, ds}, 20, 0.3f),
         v = random_tensor({1, Hkv, T, dv}, 21), a = decays(Hkv, ds, 22, -2.0f, -0.001f);
  Tensor final_state;
  const auto whole = ops::linear_attention(q, k, v, a, Tensor(), Tensor(), &final_state).to_float_vector();
  ASSERT_EQ(final_state.shape(), Shape({1, Hkv, ds, dv}));
  const Tensor decay = ops::linear_attention_decay(a);
  Tensor state = Tensor::zeros({Hkv, ds, dv});
  std::vector<float> stepped(whole.size());
  for (int64_t t = 0; t < T; ++t) {
    const Tensor out = ops::linear_attention_step(state, q.slice(2, t, t + 1).reshape({Hq, ds}),
                                                  k.slice(2, t, t + 1).reshape({Hkv, ds}),
                                                  v.slice(2, t, t + 1).reshape({Hkv, dv}), decay);
    const auto o = out.to_float_vector();
    for (int64_t h = 0; h < Hq; ++h)
      std::copy(o.begin() + h * dv, o.begin() + (h + 1) * dv, stepped.begin() + (h * T + t) * dv);
  }
  const double e_out = max_rel(stepped, whole), e_state = max_rel(state.to_float_vector(), final_state.to_float_vector());
  std::printf("STEP T=%lld out rel=%.2e final_state rel=%.2e\n", static_cast<long long>(T), e_out, e_state);
  EXPECT_LE(e_out, 2e-6);
  EXPECT_LE(e_state, 2e-6);
}

TEST(LinearAttentionStep, PrefillInTwoPartsEqualsOneCall) {
  const int64_t B = 2, Hq = 2, Hkv = 1, T = 200, split = 120, ds = 32, dv = 32;
  Tensor q = random_tensor({B, Hq, T, ds}, 23, 0.3f), k = random_tensor({B, Hkv, T, ds}, 24, 0.3f),
         v = random_tensor({B, Hkv, T, dv}, 25), a = decays(Hkv, ds, 26, -2.0f, -0.001f);
  for (Isa isa : supported_isas()) {
    ScopedIsa scope(isa);
    SCOPED_TRACE(isa_name(isa));
    Tensor final_whole, mid, final_parts;
    const Tensor whole = ops::linear_attention(q, k, v, a, Tensor(), Tensor(), &final_whole);
    auto part = [&](const Tensor& x, int64_t t0, int64_t t1) { return x.slice(2, t0, t1); };
    const Tensor first = ops::linear_attention(part(q, 0, split), part(k, 0, split), part(v, 0, split), a, Tensor(),
                                               Tensor(), &mid);
    const Tensor second = ops::linear_attention(part(q, split, T), part(k, split, T), part(v, split, T), a, Tensor(),
                                                mid, &final_parts);
    EXPECT_LE(max_rel(first.to_float_vector(), part(whole, 0, split).contiguous().to_float_vector()), 2e-6);
    EXPECT_LE(max_rel(second.to_float_vector(), part(whole, split, T).contiguous().to_float_vector()), 2e-6);
    EXPECT_LE(max_rel(final_parts.to_float_vector(), final_whole.to_float_vector()), 2e-6);
  }
}

TEST(LinearAttentionOp, NonContiguousInputs) {
  // [B, T, H, D] buffers viewed as [B, H, T, D], as a model produces them after a projection.
  const int64_t T = 70;
  Tensor q = random_tensor({1, T, 2, 8}, 28).transpose(1, 2), k = random_tensor({1, T, 1, 8}, 29).transpose(1, 2),
         v = random_tensor({1, T, 1, 4}, 30).transpose(1, 2);
  const Tensor a = decays(1, 8, 31);
  ASSERT_FALSE(q.is_contiguous());
  EXPECT_EQ(ops::linear_attention(q, k, v, a).to_float_vector(),
            ops::linear_attention(q.contiguous(), k.contiguous(), v.contiguous(), a).to_float_vector());
}

TEST(LinearAttentionOp, Errors) {
  auto z = [](const Shape& s) { return Tensor::zeros(s); };
  const Tensor q = z({1, 2, 5, 4}), k = z({1, 1, 5, 4}), v = z({1, 1, 5, 3}), a = z({1, 4});
  EXPECT_NO_THROW(ops::linear_attention(q, k, v, a));
  EXPECT_THROW(ops::linear_attention(z({2, 5, 4}), k, v, a), ShapeError);                    // rank
  EXPECT_THROW(ops::linear_attention(z({2, 2, 5, 4}), k, v, a), ShapeError);                 // batch
  EXPECT_THROW(ops::linear_attention(z({1, 2, 6, 4}), k, v, a), ShapeError);                 // T
  EXPECT_THROW(ops::linear_attention(z({1, 2, 5, 8}), k, v, a), ShapeError);                 // d_s
  EXPECT_THROW(ops::linear_attention(z({1, 3, 5, 4}), z({1, 2, 5, 4}), z({1, 2, 5, 3}), z({2, 4})), ShapeError);  // Hq % Hkv
  EXPECT_THROW(ops::linear_attention(q, k, z({1, 2, 5, 3}), a), ShapeError);                 // k vs v heads
  EXPECT_THROW(ops::linear_attention(q, k, v, z({4})), ShapeError);                          // log_decay rank
  EXPECT_THROW(ops::linear_attention(q, k, v, z({2, 4})), ShapeError);                       // log_decay heads
  EXPECT_THROW(ops::linear_attention(q, k, v, a, Tensor(), z({1, 1, 4, 4})), ShapeError);    // initial_state
  EXPECT_THROW(ops::linear_attention(q, Tensor::zeros({1, 1, 5, 4}, DType::I32), v, a), DTypeError);
  // A positive decay: a ValueError that names log_decay and the entry.
  Tensor bad = z({1, 4});
  bad.data<float>()[2] = 0.5f;
  try {
    ops::linear_attention(q, k, v, bad);
    ADD_FAILURE() << "positive log_decay accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("log_decay[0, 2]"), std::string::npos) << e.what();
  }
  bad.data<float>()[2] = NAN;
  EXPECT_THROW(ops::linear_attention(q, k, v, bad), ValueError);
  // doc_ids: decreasing, wrong dtype, wrong shape.
  try {
    ops::linear_attention(q, k, v, a, Tensor::from_vector(std::vector<int64_t>{0, 0, 1, 0, 2}, {1, 5}));
    ADD_FAILURE() << "decreasing doc_ids accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("doc_ids"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::linear_attention(q, k, v, a, z({1, 5})), DTypeError);
  EXPECT_THROW(ops::linear_attention(q, k, v, a, Tensor::from_vector(std::vector<int32_t>{0, 0, 0, 0}, {1, 4})),
               ShapeError);
  // The step.
  Tensor state = z({1, 4, 3});
  const Tensor decay = ops::linear_attention_decay(a);
  EXPECT_NO_THROW(ops::linear_attention_step(state, z({2, 4}), z({1, 4}), z({1, 3}), decay));
  EXPECT_THROW(ops::linear_attention_step(state, z({2, 5}), z({1, 4}), z({1, 3}), decay), ShapeError);
  EXPECT_THROW(ops::linear_attention_step(state, z({3, 4}), z({2, 4}), z({1, 3}), decay), ShapeError);
  EXPECT_THROW(ops::linear_attention_decay(bad), ValueError);
}

TEST(LinearAttentionOp, EmptySequenceKeepsTheInitialState) {
  const Tensor init = random_tensor({1, 1, 4, 3}, 27);
  Tensor last;
  const Tensor out = ops::linear_attention(Tensor::zeros({1, 2, 0, 4}), Tensor::zeros({1, 1, 0, 4}),
                                           Tensor::zeros({1, 1, 0, 3}), Tensor::zeros({1, 4}), Tensor(), init, &last);
  EXPECT_EQ(out.shape(), Shape({1, 2, 0, 3}));
  EXPECT_EQ(last.to_float_vector(), init.to_float_vector());
}

}  // namespace
}  // namespace corelm
