// The fast (GEMM-based) causal attention and cross-entropy kernels against the reference ones on
// every non-reference ISA path this CPU supports: values and gradients within float tolerance,
// and bitwise batch and thread-count invariance (a sequence's results do not depend on the other
// sequences of the batch or on the number of threads).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/tensor_factories.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

using testing::random_tensor;

std::vector<Isa> fast_isas() {
  std::vector<Isa> out;
  for (Isa isa : supported_isas())
    if (isa != Isa::Reference) out.push_back(isa);
  return out;
}

struct AttentionResult {
  std::vector<float> out, dq, dk, dv;
};

AttentionResult attention_with_grads(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g) {
  Tensor q = q0.clone(), k = k0.clone(), v = v0.clone();
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  Tensor out = ops::causal_attention(q, k, v);
  out.backward(g);
  return {out.to_float_vector(), q.grad().to_float_vector(), k.grad().to_float_vector(), v.grad().to_float_vector()};
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, scale)) << what << " element " << i;
}

struct Shape6 { int64_t B, Hq, Hkv, T, S, D; };

// Shapes that cross the 64-row query blocks, with T < S (a KV prefix), GQA and odd head sizes.
const Shape6 kShapes[] = {{2, 4, 2, 130, 130, 64}, {1, 2, 1, 70, 97, 16}, {3, 3, 1, 5, 9, 7}, {1, 1, 1, 1, 65, 8}};

TEST(AttentionFast, MatchesReferenceOnEveryPath) {
  for (const Shape6& c : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B" << c.B << " Hq" << c.Hq << " Hkv" << c.Hkv << " T" << c.T << " S" << c.S
                                      << " D" << c.D);
    const Tensor q = random_tensor({c.B, c.Hq, c.T, c.D}, 1), k = random_tensor({c.B, c.Hkv, c.S, c.D}, 2),
                 v = random_tensor({c.B, c.Hkv, c.S, c.D}, 3), g = random_tensor({c.B, c.Hq, c.T, c.D}, 4);
    AttentionResult want;
    {
      ScopedIsa ref(Isa::Reference);
      want = attention_with_grads(q, k, v, g);
    }
    for (Isa isa : fast_isas()) {
      SCOPED_TRACE(isa_name(isa));
      ScopedIsa scoped(isa);
      const AttentionResult got = attention_with_grads(q, k, v, g);
      expect_close(got.out, want.out, 2e-6, "out");
      expect_close(got.dq, want.dq, 1e-5, "dq");
      expect_close(got.dk, want.dk, 1e-5, "dk");
      expect_close(got.dv, want.dv, 1e-5, "dv");
    }
  }
}

TEST(AttentionFast, SequenceResultsIndependentOfBatchAndThreads) {
  const int64_t B = 3, Hq = 4, Hkv = 2, T = 80, D = 32;
  const Tensor q = random_tensor({B, Hq, T, D}, 5), k = random_tensor({B, Hkv, T, D}, 6),
               v = random_tensor({B, Hkv, T, D}, 7), g = random_tensor({B, Hq, T, D}, 8);
  for (Isa isa : fast_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    set_num_threads(1);
    const AttentionResult batch = attention_with_grads(q, k, v, g);
    set_num_threads(2);
    const AttentionResult threaded = attention_with_grads(q, k, v, g);
    set_num_threads(1);
    EXPECT_EQ(batch.out, threaded.out);
    EXPECT_EQ(batch.dq, threaded.dq);
    EXPECT_EQ(batch.dk, threaded.dk);
    EXPECT_EQ(batch.dv, threaded.dv);
    // Sequence 1 alone gives bit for bit its slice of the batched result.
    const auto one = [](const Tensor& t) { return t.slice(0, 1, 2).contiguous(); };
    const AttentionResult alone = attention_with_grads(one(q), one(k), one(v), one(g));
    const auto slice = [](const std::vector<float>& all, int64_t per_seq) {
      return std::vector<float>(all.begin() + per_seq, all.begin() + 2 * per_seq);
    };
    EXPECT_EQ(alone.out, slice(batch.out, Hq * T * D));
    EXPECT_EQ(alone.dq, slice(batch.dq, Hq * T * D));
    EXPECT_EQ(alone.dk, slice(batch.dk, Hkv * T * D));
    EXPECT_EQ(alone.dv, slice(batch.dv, Hkv * T * D));
  }
}

TEST(AttentionFast, NoGradForwardEqualsGradForward) {
  const Tensor q = random_tensor({2, 2, 9, 8}, 9), k = random_tensor({2, 1, 12, 8}, 10), v = random_tensor({2, 1, 12, 8}, 11);
  for (Isa isa : fast_isas()) {
    ScopedIsa scoped(isa);
    const AttentionResult with_grad = attention_with_grads(q, k, v, Tensor::ones({2, 2, 9, 8}));
    EXPECT_EQ(ops::causal_attention(q, k, v).to_float_vector(), with_grad.out) << isa_name(isa);
  }
}

struct LossResult {
  float loss;
  std::vector<float> grad;
};

LossResult cross_entropy_with_grad(const Tensor& logits0, const Tensor& targets, int64_t ignore_index) {
  Tensor logits = logits0.clone();
  logits.set_requires_grad(true);
  Tensor loss = ops::cross_entropy(logits, targets, ignore_index);
  loss.backward();
  return {static_cast<float>(loss.item()), logits.grad().to_float_vector()};
}

TEST(CrossEntropyFast, MatchesReferenceOnEveryPath) {
  const int64_t N = 6, V = 1037;  // a tail after the 16-lane vectors and the 1024-float chunks
  Tensor logits = random_tensor({N, V}, 12, 4.0f);
  // Row 2 is ignored, row 3 is nearly one-hot (p close to 1 at the target: the cancelling case).
  std::vector<int64_t> ids = {5, 1036, -100, 7, 0, 512};
  auto values = logits.to_float_vector();
  values[3 * V + 7] = 40.0f;
  logits = Tensor::from_vector(values, {N, V});
  const Tensor targets = Tensor::from_vector(ids, {N});
  LossResult want;
  {
    ScopedIsa ref(Isa::Reference);
    want = cross_entropy_with_grad(logits, targets, -100);
  }
  for (Isa isa : fast_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    const LossResult got = cross_entropy_with_grad(logits, targets, -100);
    EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::fabs(want.loss));
    ASSERT_EQ(got.grad.size(), want.grad.size());
    for (size_t i = 0; i < got.grad.size(); ++i)
      ASSERT_NEAR(got.grad[i], want.grad[i], 1e-6 * std::fabs(want.grad[i]) + 1e-11) << "element " << i;
  }
}

TEST(CrossEntropyFast, RowGradientsIndependentOfOtherRowsAndThreads) {
  const int64_t N = 9, V = 300;
  const Tensor logits = random_tensor({N, V}, 13);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < N; ++i) ids.push_back((i * 37) % V);
  const Tensor targets = Tensor::from_vector(ids, {N});
  for (Isa isa : fast_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    set_num_threads(2);
    const LossResult threaded = cross_entropy_with_grad(logits, targets, -100);
    set_num_threads(1);
    const LossResult all = cross_entropy_with_grad(logits, targets, -100);
    EXPECT_EQ(all.grad, threaded.grad);
    EXPECT_EQ(all.loss, threaded.loss);
    // Row 4 alone equals, bit for bit, row 4 of a batch whose other rows are ignored (so the
    // mean's 1/count is the same): the other rows' logits do not leak into it.
    std::vector<int64_t> only4(N, -100);
    only4[4] = ids[4];
    const LossResult in_batch = cross_entropy_with_grad(logits, Tensor::from_vector(only4, {N}), -100);
    const LossResult alone = cross_entropy_with_grad(logits.slice(0, 4, 5).contiguous(), targets.slice(0, 4, 5), -100);
    EXPECT_EQ(alone.loss, in_batch.loss);
    EXPECT_EQ(alone.grad, std::vector<float>(in_batch.grad.begin() + 4 * V, in_batch.grad.begin() + 5 * V));
  }
}

}  // namespace
}  // namespace corelm
