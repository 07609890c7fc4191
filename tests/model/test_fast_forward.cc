// The fast inference path (Decoder::prepare_inference(BF16)) against the op-based reference path
// on small random models: logits within bf16 tolerance, greedy top-1 agreement, the Logits
// options, prefill/decode consistency, packing lifecycle and bad input, on every ISA path.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/isa.h"
#include "corelm/model.h"
#include "corelm/model_loader.h"
#include "common/model_factories.h"

namespace corelm::model {
namespace {

ModelConfig small_config(bool qwen2) { return testing::small_decoder_config(qwen2, 0.08); }
using testing::ids_of;

using testing::random_ids;

struct Compare {
  double max_rel = 0;  // max |fast - ref| / max |ref|
  double top1 = 0;     // fraction of positions where the argmaxes agree
};

Compare compare_logits(const Tensor& fast, const Tensor& ref) {
  auto a = fast.to_float_vector(), b = ref.to_float_vector();
  const int64_t V = fast.size(-1), n = static_cast<int64_t>(a.size()) / V;
  double diff = 0, scale = 0;
  int64_t agree = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  for (int64_t r = 0; r < n; ++r) {
    auto arg = [&](const std::vector<float>& v) { return std::max_element(v.begin() + r * V, v.begin() + (r + 1) * V) - v.begin(); };
    agree += arg(a) == arg(b);
  }
  return {diff / scale, double(agree) / double(n)};
}

// Prefill of ids [B, T] then `steps` decode steps feeding fixed tokens; all logits concatenated.
Tensor run(const Decoder& d, const std::vector<int64_t>& prompt, int64_t B, int64_t T, int64_t steps) {
  KVCache cache(d.config(), B, d.config().max_position_embeddings);
  std::vector<int64_t> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) rows[b] = b;
  std::vector<Tensor> parts{d.forward_cached(ids_of(prompt, B, T), cache, rows)};
  for (int64_t s = 0; s < steps; ++s)
    parts.push_back(d.forward_cached(ids_of(random_ids(B, d.config().vocab_size, 100 + s), B, 1), cache, rows));
  std::vector<float> all;
  for (const auto& p : parts) {
    auto v = p.to_float_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return Tensor::from_vector(all, {static_cast<int64_t>(all.size()) / d.config().vocab_size, d.config().vocab_size});
}

class FastForward : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { scoped_ = std::make_unique<ScopedIsa>(GetParam()); }
  void TearDown() override { scoped_.reset(); }
  std::unique_ptr<ScopedIsa> scoped_;
};

TEST_P(FastForward, LogitsMatchReferenceWithinBf16Tolerance) {
  for (bool qwen2 : {false, true}) {
    Decoder d(small_config(qwen2));
    d.init_weights(7);
    const int64_t B = 3, T = 20;
    auto prompt = random_ids(B * T, d.config().vocab_size, 1);
    Tensor ref = run(d, prompt, B, T, 4);
    d.prepare_inference(Precision::BF16);
    ASSERT_EQ(d.inference_precision(), Precision::BF16);
    Tensor fast = run(d, prompt, B, T, 4);
    const Compare c = compare_logits(fast, ref);
    std::cout << "[ fast vs reference ] " << (qwen2 ? "qwen2" : "llama") << " isa=" << isa_name(GetParam())
              << " max_rel=" << c.max_rel << " top1_agreement=" << c.top1 << "\n";
    RecordProperty(qwen2 ? "max_rel_qwen2" : "max_rel_llama", std::to_string(c.max_rel));
    EXPECT_LE(c.max_rel, 2e-2);
    EXPECT_GE(c.top1, 0.95);
  }
}

// Greedy generation: both paths pick their own tokens from their own logits.
TEST_P(FastForward, GreedyGenerationAgreesWithReference) {
  Decoder d(small_config(false));
  d.init_weights(11);
  auto greedy = [&](const std::vector<int64_t>& prompt, int64_t n) {
    KVCache cache(d.config(), 1, d.config().max_position_embeddings);
    std::vector<int64_t> out;
    Tensor logits = d.forward_cached(ids_of(prompt, 1, static_cast<int64_t>(prompt.size())), cache, {0}, Logits::Last);
    for (int64_t i = 0; i < n; ++i) {
      auto v = logits.to_float_vector();
      out.push_back(std::max_element(v.begin(), v.end()) - v.begin());
      logits = d.forward_cached(ids_of({out.back()}, 1, 1), cache, {0}, Logits::Last);
    }
    return out;
  };
  int64_t same_prefix = 0, total = 0;
  std::vector<std::vector<int64_t>> ref;
  for (uint64_t p = 0; p < 4; ++p) ref.push_back(greedy(random_ids(5 + p * 7, 384, 50 + p), 24));
  d.prepare_inference();
  for (uint64_t p = 0; p < 4; ++p) {
    auto fast = greedy(random_ids(5 + p * 7, 384, 50 + p), 24);
    int64_t k = 0;
    while (k < 24 && fast[k] == ref[p][k]) ++k;
    same_prefix += k;
    total += 24;
  }
  std::cout << "[ greedy ] isa=" << isa_name(GetParam()) << " identical prefix " << same_prefix << " of " << total
            << " tokens\n";
  EXPECT_GE(double(same_prefix) / double(total), 0.75);
}

TEST_P(FastForward, LogitsOptionsSelectTheSameNumbers) {
  Decoder d(small_config(true));
  d.init_weights(3);
  d.prepare_inference();
  const int64_t B = 2, T = 9, V = d.config().vocab_size, H = d.config().hidden_size;
  auto prompt = random_ids(B * T, V, 4);
  auto fresh = [&](Logits which) {
    KVCache cache(d.config(), B, 32);
    d.forward_cached(ids_of({5, 6, 7}, 1, 3), cache, {1}, Logits::None);  // row 1 starts at position 3
    return d.forward_cached(ids_of(prompt, B, T), cache, {0, 1}, which).contiguous();
  };
  Tensor all = fresh(Logits::All), last = fresh(Logits::Last), hidden = fresh(Logits::None);
  ASSERT_EQ(last.shape(), (Shape{B, 1, V}));
  ASSERT_EQ(hidden.shape(), (Shape{B, T, H}));
  Tensor from_hidden = d.logits_from_hidden(hidden).contiguous();
  EXPECT_EQ(0, std::memcmp(from_hidden.data<float>(), all.data<float>(), all.nbytes()));
  for (int64_t b = 0; b < B; ++b)
    EXPECT_EQ(0, std::memcmp(last.data<float>() + b * V, all.data<float>() + (b * T + T - 1) * V, V * sizeof(float)));
}

// Prefilling a prompt at once or one token at a time gives the same bits (each query's attention
// and each row's matmuls are computed the same way whatever the block).
TEST_P(FastForward, PrefillEqualsTokenByTokenDecode) {
  Decoder d(small_config(false));
  d.init_weights(5);
  d.prepare_inference();
  const int64_t T = 19, V = d.config().vocab_size;
  auto prompt = random_ids(T, V, 9);
  KVCache a(d.config(), 1, 32), b(d.config(), 1, 32);
  Tensor once = d.forward_cached(ids_of(prompt, 1, T), a, {0}).contiguous();
  for (int64_t t = 0; t < T; ++t) {
    Tensor step = d.forward_cached(ids_of({prompt[t]}, 1, 1), b, {0}).contiguous();
    ASSERT_EQ(0, std::memcmp(step.data<float>(), once.data<float>() + t * V, V * sizeof(float))) << "t=" << t;
  }
}

// forward()/forward_hidden() take the fast path only when it is prepared and no gradient is
// being recorded; otherwise (training) they stay on the op path.
TEST_P(FastForward, FullForwardUsesFastPathOnlyWithoutGrad) {
  Decoder d(small_config(false));
  d.init_weights(8);
  const int64_t B = 2, T = 7;
  Tensor ids = ids_of(random_ids(B * T, d.config().vocab_size, 12), B, T);
  Tensor ref = d.forward(ids).contiguous();
  d.prepare_inference();
  Tensor with_grad_mode = d.forward(ids).contiguous();
  EXPECT_EQ(0, std::memcmp(with_grad_mode.data<float>(), ref.data<float>(), ref.nbytes()));
  autograd::NoGradGuard no_grad;
  KVCache cache(d.config(), B, T);
  Tensor cached = d.forward_cached(ids, cache, {0, 1}).contiguous();
  Tensor fast = d.forward(ids).contiguous();
  EXPECT_EQ(0, std::memcmp(fast.data<float>(), cached.data<float>(), cached.nbytes()));
  EXPECT_NE(0, std::memcmp(fast.data<float>(), ref.data<float>(), ref.nbytes()));
  EXPECT_LE(compare_logits(fast, ref).max_rel, 2e-2);
  Tensor hidden = d.forward_hidden(ids).contiguous();
  ASSERT_EQ(hidden.shape(), (Shape{B, T, d.config().hidden_size}));
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FastForward, ::testing::ValuesIn(supported_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

// A real trained model (llama2.c stories260K, head_dim 8): 200 greedy tokens of the fast path
// against the reference path. bf16 may legitimately flip a near-tie, so a long identical prefix
// is required rather than equality; the test prints what it got. Measured: 200/200 with the
// vdpbf16ps kernel, 185/200 with the widening-FMA kernels (a near-tie flips at token 186).
TEST(FastForwardTrained, Stories260KGreedyMatchesReference) {
  const std::string path = std::string(CORELM_SOURCE_DIR) + "/../shared/data/models/stories260K/stories260K.bin";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found (see /work/shared/data/MANIFEST.md)";
  LoadOptions options;
  options.require_tokenizer = false;
  Checkpoint ckpt = load_model(path, options);
  Decoder& d = ckpt.model.decoder;
  auto greedy = [&](int64_t n) {
    KVCache cache(d.config(), 1, d.config().max_position_embeddings);
    std::vector<int64_t> out{1};  // BOS, as llama2.c starts
    for (int64_t i = 0; i < n; ++i) {
      Tensor logits = d.forward_cached(ids_of({out.back()}, 1, 1), cache, {0}, Logits::Last);
      auto v = logits.to_float_vector();
      out.push_back(std::max_element(v.begin(), v.end()) - v.begin());
    }
    return out;
  };
  const auto ref = greedy(200);
  d.prepare_inference();
  const auto fast = greedy(200);
  size_t k = 0;
  while (k < ref.size() && ref[k] == fast[k]) ++k;
  std::cout << "[ stories260K ] fast path greedy identical for " << k - 1 << " of 200 tokens\n";
  EXPECT_GE(k - 1, 150u);
}

TEST(FastForwardLifecycle, PreparationStatesAndStaleness) {
  Decoder d(small_config(false));
  d.init_weights(1);
  EXPECT_FALSE(d.inference_prepared());
  EXPECT_EQ(d.inference_precision(), Precision::F32);
  d.prepare_inference(Precision::F32);
  EXPECT_TRUE(d.inference_prepared());
  EXPECT_EQ(d.inference_precision(), Precision::F32);
  d.prepare_inference();
  EXPECT_EQ(d.inference_precision(), Precision::BF16);
  d.load_parameter("model.norm.weight", Tensor::full({d.config().hidden_size}, 2.0));
  EXPECT_FALSE(d.inference_prepared()) << "load_parameter must drop the stale packing";
  d.prepare_inference();
  d.drop_inference();
  EXPECT_FALSE(d.inference_prepared());
  EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
  EXPECT_STREQ(precision_name(Precision::F32), "f32");
  EXPECT_THROW(parse_precision("fp8"), ValueError);
}

TEST(FastForwardLifecycle, BadInputIsAnError) {
  Decoder d(small_config(false));
  d.init_weights(1);
  d.prepare_inference();
  KVCache cache(d.config(), 2, 8);
  EXPECT_THROW(d.forward_cached(ids_of({1, 999}, 1, 2), cache, {0}), IndexError);  // id outside the vocabulary
  EXPECT_THROW(d.forward_cached(ids_of(std::vector<int64_t>(9, 1), 1, 9), cache, {0}), ValueError);  // capacity
  EXPECT_THROW(d.forward_cached(ids_of({1, 2}, 2, 1), cache, {0, 0}), ValueError);  // row twice
  EXPECT_THROW(d.forward_cached(ids_of({1}, 1, 1), cache, {5}), IndexError);
  EXPECT_THROW(d.logits_from_hidden(Tensor::zeros({2, 7})), ShapeError);
  EXPECT_THROW(d.forward_cached(Tensor::zeros({1, 0}, DType::I64), cache, {0}, Logits::Last), ValueError);
  EXPECT_EQ(cache.length(0), 0) << "a failed call must not advance the cache";
}

// The RoPE table follows the positions used, not max_position_embeddings: a config claiming a
// 16M context prepares in no time (it used to build a 4 GB table first), and a cache longer
// than the first table still decodes exactly like the reference path.
TEST(FastForwardLifecycle, RopeTableGrowsWithUseNotWithTheConfiguredContext) {
  ModelConfig c = small_config(false);
  c.max_position_embeddings = ModelConfig::kMaxPositions;
  Decoder d(c);
  d.init_weights(1);
  const auto t0 = std::chrono::steady_clock::now();
  d.prepare_inference();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  // Rows start at position 8188 (the zeros of a fresh cache stand for the earlier keys, the same
  // for both paths) and run past 8192, the first table's end.
  const int64_t at = 8188, n = 8;
  KVCache fast(c, 1, at + n + 1), ref(c, 1, at + n + 1);
  fast.set_length(0, at);
  ref.set_length(0, at);
  const std::vector<int64_t> ids = random_ids(n, c.vocab_size, 3);
  const Tensor a = d.forward_cached(ids_of(ids, 1, n), fast, {0});
  const Tensor b = d.forward_cached(ids_of({7}, 1, 1), fast, {0});
  d.drop_inference();
  const Tensor a_ref = d.forward_cached(ids_of(ids, 1, n), ref, {0});
  const Tensor b_ref = d.forward_cached(ids_of({7}, 1, 1), ref, {0});
  EXPECT_LT(compare_logits(a, a_ref).max_rel, 0.05);
  EXPECT_LT(compare_logits(b, b_ref).max_rel, 0.05);
}

}  // namespace
}  // namespace corelm::model
