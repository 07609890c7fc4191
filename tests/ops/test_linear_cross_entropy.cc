// The fused LM head + cross-entropy (full and sampled softmax) against the unfused composition
// cross_entropy(linear(hidden, weight), targets) on every ISA path, finite differences, the
// incoming-gradient scaling, thread-count independence and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/autocast.h"
#include "corelm/autograd.h"
#include "corelm/dtype.h"
#include "corelm/error.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/tensor.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

using testing::leaf;
using testing::random_tensor;

// Max |a - b| relative to max |b|, so a near-zero entry cannot blow the ratio up.
double rel_err(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::fabs(double(x[i]) - y[i]));
    scale = std::max(scale, std::fabs(double(y[i])));
  }
  return diff / scale;
}

// Targets in [0, v) with every `ignore_every`-th row ignored (-100).
Tensor make_targets(int64_t n, int64_t v, uint64_t seed, int64_t ignore_every) {
  Generator gen(seed);
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = ignore_every > 0 && i % ignore_every == 3 ? -100 : int64_t(gen.below(v));
  return Tensor::from_vector(t, {n});
}

struct Grads {
  double loss;
  Tensor hidden, weight;
};

template <typename LossFn>
Grads run(const Tensor& hidden0, const Tensor& weight0, LossFn fn) {
  Tensor hidden = leaf(hidden0.clone()), weight = leaf(weight0.clone());
  Tensor loss = fn(hidden, weight);
  loss.backward();
  return Grads{loss.item(), hidden.grad(), weight.grad()};
}

// 600 rows: two full chunks of kLmHeadChunkRows (256) and a ragged one.
TEST(LinearCrossEntropy, MatchesUnfusedCompositionOnEveryIsa) {
  const int64_t N = 600, H = 24, V = 70;
  const Tensor hidden = random_tensor({N, H}, 1), weight = random_tensor({V, H}, 2, 0.5f);
  const Tensor targets = make_targets(N, V, 3, 7);
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    const Grads ref = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
      return ops::cross_entropy(ops::linear(h, w), targets);
    });
    const Grads fused = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
      return ops::linear_cross_entropy(h, w, targets);
    });
    EXPECT_NEAR(fused.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
    EXPECT_LE(rel_err(fused.hidden, ref.hidden), 1e-4);
    EXPECT_LE(rel_err(fused.weight, ref.weight), 1e-4);
    // Without gradients the loss comes from the forward-only kernel: the same value.
    autograd::NoGradGuard no_grad;
    EXPECT_NEAR(ops::linear_cross_entropy(hidden, weight, targets).item(), ref.loss, 1e-5 * std::fabs(ref.loss));
  }
}

TEST(LinearCrossEntropy, FiniteDifferences) {
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{2, -100, 6, 0, 5}, {5});
  testing::expect_gradients_match(
      [&](const std::vector<Tensor>& x) { return ops::linear_cross_entropy(x[0], x[1], targets); },
      {leaf({5, 4}, 11), leaf({7, 4}, 12)});
}

TEST(LinearCrossEntropy, BackwardScalesByTheIncomingGradient) {
  const Tensor hidden = random_tensor({9, 8}, 4), weight = random_tensor({13, 8}, 5);
  const Tensor targets = make_targets(9, 13, 6, 0);
  const Grads once = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
    return ops::linear_cross_entropy(h, w, targets);
  });
  const Grads thrice = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
    return ops::scale(ops::linear_cross_entropy(h, w, targets), 3.0f);
  });
  EXPECT_LE(rel_err(thrice.hidden, ops::scale(once.hidden, 3.0f)), 1e-6);
  EXPECT_LE(rel_err(thrice.weight, ops::scale(once.weight, 3.0f)), 1e-6);
}

TEST(LinearCrossEntropy, AllIgnoredGivesZeroLossAndZeroGradients) {
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{-100, -100}, {2});
  const Grads g = run(random_tensor({2, 4}, 7), random_tensor({5, 4}, 8), [&](const Tensor& h, const Tensor& w) {
    return ops::linear_cross_entropy(h, w, targets);
  });
  EXPECT_EQ(g.loss, 0.0);
  for (float x : g.hidden.to_float_vector()) EXPECT_EQ(x, 0.0f);
  for (float x : g.weight.to_float_vector()) EXPECT_EQ(x, 0.0f);
}

TEST(LinearCrossEntropy, ResultsDoNotDependOnTheThreadCount) {
  const int64_t N = 530, H = 32, V = 300;
  const Tensor hidden = random_tensor({N, H}, 9), weight = random_tensor({V, H}, 10);
  const Tensor targets = make_targets(N, V, 11, 5);
  const int saved = num_threads();
  std::vector<Grads> results;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    results.push_back(run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
      return ops::linear_cross_entropy(h, w, targets);
    }));
  }
  set_num_threads(saved);
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(results[i].loss, results[0].loss);
    EXPECT_EQ(results[i].hidden.to_float_vector(), results[0].hidden.to_float_vector());
    EXPECT_EQ(results[i].weight.to_float_vector(), results[0].weight.to_float_vector());
  }
}

TEST(LinearCrossEntropy, BadInputIsAClearError) {
  const Tensor h = random_tensor({4, 8}, 1), w = random_tensor({10, 8}, 2);
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4});
  EXPECT_THROW(ops::linear_cross_entropy(h, random_tensor({10, 7}, 3), t), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, Tensor::from_vector(std::vector<int64_t>{1, 2}, {2})), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4})),
               DTypeError);
  EXPECT_THROW(ops::linear_cross_entropy(random_tensor({2, 2, 8}, 4), w, t), ShapeError);
  try {
    ops::linear_cross_entropy(h, w, Tensor::from_vector(std::vector<int64_t>{1, 2, 10, 4}, {4}));
    FAIL() << "expected IndexError";
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("target 10 at row 2"), std::string::npos) << e.what();
  }
}

Tensor rounded_to_bf16(const Tensor& x) {
  std::vector<float> v = x.to_float_vector();
  for (float& f : v) f = bf16_to_float(float_to_bf16(f));
  return Tensor::from_vector(v, x.shape());
}

// Under ComputeDTypeScope(BF16) the products see bf16-rounded hidden and weight: the same loss and
// gradients, bit for bit, as the f32 op on operands rounded beforehand; outside the scope, f32.
TEST(LinearCrossEntropy, Bf16ComputeRoundsTheOperands) {
  const Tensor hidden = random_tensor({40, 16}, 41), weight = random_tensor({30, 16}, 42);
  const Tensor targets = make_targets(40, 30, 43, 6);
  const auto fused = [&](const Tensor& h, const Tensor& w) { return ops::linear_cross_entropy(h, w, targets); };
  // Bitwise equality holds on the rounded-operand kernel (the dpbf16 one: test_autocast.cc).
  const std::string kernel = ops::bf16_gemm_kernel();
  ops::set_bf16_gemm_kernel("rounded");
  Grads bf16;
  {
    ops::ComputeDTypeScope scope(ops::ComputeDType::BF16);
    bf16 = run(hidden, weight, fused);
  }
  const Grads pre_rounded = run(rounded_to_bf16(hidden), rounded_to_bf16(weight), fused);
  const Grads f32 = run(hidden, weight, fused);
  EXPECT_EQ(bf16.loss, pre_rounded.loss);
  EXPECT_EQ(bf16.hidden.to_float_vector(), pre_rounded.hidden.to_float_vector());
  EXPECT_EQ(bf16.weight.to_float_vector(), pre_rounded.weight.to_float_vector());
  EXPECT_NE(bf16.loss, f32.loss);  // the rounding is real
  EXPECT_NEAR(bf16.loss, f32.loss, 1e-2 * f32.loss);
  ops::set_bf16_gemm_kernel(kernel);
}

// ---- sampled softmax ----

TEST(SampledLinearCrossEntropy, WholeVocabWithZeroCorrectionIsTheFullLoss) {
  const int64_t N = 150, H = 16, V = 40;
  const Tensor hidden = random_tensor({N, H}, 21), weight = random_tensor({V, H}, 22);
  const Tensor targets = make_targets(N, V, 23, 9);
  const Tensor all = Tensor::arange(V, DType::I64);
  const Tensor zero = Tensor::zeros({V});
  const Grads full = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
    return ops::linear_cross_entropy(h, w, targets);
  });
  const Grads sampled = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
    return ops::sampled_linear_cross_entropy(h, w, targets, all, zero);
  });
  EXPECT_EQ(sampled.loss, full.loss);
  EXPECT_EQ(sampled.hidden.to_float_vector(), full.hidden.to_float_vector());
  EXPECT_EQ(sampled.weight.to_float_vector(), full.weight.to_float_vector());
}

// A candidate subset with a correction equals the composition over the gathered rows, and rows of
// the weight outside the candidates get exactly zero gradient.
TEST(SampledLinearCrossEntropy, MatchesTheGatheredComposition) {
  const int64_t N = 20, H = 12, V = 50;
  const std::vector<int64_t> cand = {1, 4, 5, 9, 17, 23, 30, 31, 44, 49};
  const int64_t C = static_cast<int64_t>(cand.size());
  std::vector<int64_t> class_ids(N), positions(N);
  Generator gen(31);
  for (int64_t i = 0; i < N; ++i) {
    positions[i] = int64_t(gen.below(C));
    class_ids[i] = cand[positions[i]];
  }
  class_ids[5] = positions[5] = -100;
  std::vector<float> corr(C);
  for (int64_t j = 0; j < C; ++j) corr[j] = 0.3f * float(j) - 1.0f;
  const Tensor hidden = random_tensor({N, H}, 32), weight = random_tensor({V, H}, 33);
  const Tensor candidates = Tensor::from_vector(cand, {C}), correction = Tensor::from_vector(corr, {C});
  const Grads sampled = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
    return ops::sampled_linear_cross_entropy(h, w, Tensor::from_vector(class_ids, {N}), candidates, correction);
  });
  // The composition: gather the candidate rows by one-hot matmul so autograd scatters back.
  std::vector<float> select(C * V, 0.0f);
  for (int64_t j = 0; j < C; ++j) select[j * V + cand[j]] = 1.0f;
  const Tensor selector = Tensor::from_vector(select, {C, V});
  const Grads ref = run(hidden, weight, [&](const Tensor& h, const Tensor& w) {
    const Tensor logits = ops::sub(ops::linear(h, ops::matmul(selector, w)), correction);
    return ops::cross_entropy(logits, Tensor::from_vector(positions, {N}));
  });
  EXPECT_NEAR(sampled.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
  EXPECT_LE(rel_err(sampled.hidden, ref.hidden), 1e-4);
  EXPECT_LE(rel_err(sampled.weight, ref.weight), 1e-4);
  const std::vector<float> gw = sampled.weight.to_float_vector();
  for (int64_t v = 0; v < V; ++v) {
    if (std::binary_search(cand.begin(), cand.end(), v)) continue;
    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(gw[v * H + k], 0.0f) << "row " << v;
  }
}

TEST(SampledLinearCrossEntropy, BadCandidatesAreClearErrors) {
  const Tensor h = random_tensor({3, 4}, 1), w = random_tensor({10, 4}, 2);
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{1, 5, 7}, {3});
  const Tensor corr = Tensor::zeros({4});
  auto cands = [](std::vector<int64_t> c) { return Tensor::from_vector(c, {int64_t(c.size())}); };
  EXPECT_THROW(ops::sampled_linear_cross_entropy(h, w, t, cands({1, 2, 5, 6}), corr), ValueError);  // 7 missing
  EXPECT_THROW(ops::sampled_linear_cross_entropy(h, w, t, cands({1, 7, 5, 8}), corr), ValueError);  // unsorted
  EXPECT_THROW(ops::sampled_linear_cross_entropy(h, w, t, cands({1, 5, 7, 10}), corr), IndexError);
  EXPECT_THROW(ops::sampled_linear_cross_entropy(h, w, t, cands({1, 5, 7}), corr), ShapeError);
}

}  // namespace
}  // namespace corelm
