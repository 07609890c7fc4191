// The greedy LM head (fast_lm_head_argmax, Decoder::forward_cached_argmax) against argmax over the
// logits of the same path: f32 (reference), bf16 and int8; one row and 16; a vocabulary of several
// LM-head blocks with a ragged tail; constructed ties within and across blocks; NaN rows; the
// vocabulary limit; batch and thread invariance. Equality is exact: the same logits feed both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/thread_pool.h"
#include "common/model_factories.h"
#include "model/fast_forward.h"

namespace corelm::model {
namespace {

// 2 full LM-head blocks and a tail that is not a multiple of any kernel panel (8,743 tokens).
constexpr int64_t kVocab = 2 * kLmHeadBlock + 551;

ModelConfig config(bool tied) {
  ModelConfig c = testing::tiny_decoder_config(kVocab, 0.1);
  c.tie_word_embeddings = tied;
  return c;
}

std::vector<int64_t> random_ids(int64_t n, uint64_t seed) { return testing::random_ids(n, kVocab, seed); }

// First index of the largest value over [0, limit), as torch.argmax (and the sampler) do.
int64_t first_argmax(const float* row, int64_t limit) {
  int64_t best = 0;
  for (int64_t j = 1; j < limit; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

std::vector<int64_t> iota_rows(int64_t B) {
  std::vector<int64_t> r(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) r[static_cast<size_t>(b)] = b;
  return r;
}

// Prefill [B, 5] then `steps` greedy steps twice, once through Logits::Last + argmax and once
// through forward_cached_argmax (each feeding its own choices back): the ids agree at every step
// and both caches end bitwise equal. Returns the fused path's ids, step-major.
std::vector<int64_t> check_steps(const Decoder& d, int64_t B, int64_t steps, uint64_t seed, int64_t limit = 0) {
  autograd::NoGradGuard no_grad;
  const int64_t T = 5, lim = limit > 0 ? limit : kVocab;
  KVCache by_logits(d.config(), B, 32), fused(d.config(), B, 32);
  const std::vector<int64_t> rows = iota_rows(B);
  Tensor ids = Tensor::from_vector(random_ids(B * T, seed), {B, T});
  std::vector<int64_t> all;
  for (int64_t s = 0; s <= steps; ++s) {
    const Tensor logits = d.forward_cached(ids, by_logits, rows, Logits::Last).contiguous();
    const std::vector<int64_t> got = d.forward_cached_argmax(ids, fused, rows, limit);
    EXPECT_EQ(static_cast<int64_t>(got.size()), B);
    for (int64_t b = 0; b < B; ++b)
      EXPECT_EQ(got[static_cast<size_t>(b)], first_argmax(logits.data<float>() + b * kVocab, lim))
          << "row " << b << " step " << s;
    all.insert(all.end(), got.begin(), got.end());
    ids = Tensor::from_vector(got, {B, 1});
  }
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(by_logits.length(b), fused.length(b));
  for (int64_t l = 0; l < d.config().num_hidden_layers; ++l) {
    EXPECT_EQ(0, std::memcmp(by_logits.k(l).data<float>(), fused.k(l).data<float>(), by_logits.k(l).numel() * 4));
    EXPECT_EQ(0, std::memcmp(by_logits.v(l).data<float>(), fused.v(l).data<float>(), by_logits.v(l).numel() * 4));
  }
  return all;
}

class FusedArgmax : public ::testing::TestWithParam<Precision> {};

TEST_P(FusedArgmax, EqualsArgmaxOfTheLogitsForOneAndSixteenRows) {
  Decoder d(config(GetParam() != Precision::BF16));  // tied and untied heads
  d.init_weights(3);
  d.prepare_inference(GetParam());
  check_steps(d, 1, 6, 11);
  check_steps(d, 16, 4, 12);
}

TEST_P(FusedArgmax, HonoursTheVocabularyLimit) {
  Decoder d(config(true));
  d.init_weights(4);
  d.prepare_inference(GetParam());
  check_steps(d, 3, 3, 13, 300);                 // inside the first block
  check_steps(d, 3, 3, 14, kLmHeadBlock + 17);   // one column into the second block
}

TEST_P(FusedArgmax, RowsDoNotDependOnTheBatchOrTheThreads) {
  Decoder d(config(true));
  d.init_weights(5);
  d.prepare_inference(GetParam());
  autograd::NoGradGuard no_grad;
  const std::vector<int64_t> prompts = random_ids(16 * 4, 21);
  auto run = [&](int64_t B, int64_t first) {
    KVCache cache(d.config(), B, 32);
    std::vector<int64_t> p(prompts.begin() + first * 4, prompts.begin() + (first + B) * 4);
    std::vector<int64_t> out;
    Tensor ids = Tensor::from_vector(p, {B, 4});
    for (int s = 0; s < 4; ++s) {
      const std::vector<int64_t> got = d.forward_cached_argmax(ids, cache, iota_rows(B));
      out.push_back(got[static_cast<size_t>(B == 1 ? 0 : 5)]);
      ids = Tensor::from_vector(got, {B, 1});
    }
    return out;
  };
  const std::vector<int64_t> batched = run(16, 0);
  EXPECT_EQ(batched, run(1, 5));
  set_num_threads(2);
  EXPECT_EQ(batched, run(16, 0));
  set_num_threads(1);
}

TEST(FusedArgmaxPacked, TiesGoToTheFirstIndexWithinAndAcrossBlocks) {
  for (Precision precision : {Precision::BF16, Precision::Int8}) {
    SCOPED_TRACE(precision_name(precision));
    Decoder d(config(false));
    d.init_weights(6);
    {
      // The LM head: zeros except rows 700, 701 (same block), and one row in each later block equal,
      // so every hidden row meets ties: among those four when their dot product is positive,
      // among the zero rows (first: 0) otherwise.
      autograd::NoGradGuard no_grad;
      Tensor& w = d.parameter("lm_head.weight");
      std::vector<float> head(static_cast<size_t>(kVocab * 64), 0.0f);
      for (int64_t r : {int64_t{700}, int64_t{701}, kLmHeadBlock + 476, 2 * kLmHeadBlock + 52})
        for (int64_t k = 0; k < 64; ++k) head[static_cast<size_t>(r * 64 + k)] = std::sin(0.37f * static_cast<float>(k + 1));
      d.load_parameter("lm_head.weight", Tensor::from_vector(head, w.shape()));
    }
    const FastWeights w = pack_fast_weights(d, precision);
    const int64_t n = 8;
    std::vector<float> hidden(static_cast<size_t>(n * 64));
    for (int64_t i = 0; i < n * 64; ++i)
      hidden[static_cast<size_t>(i)] = std::cos(0.11f * static_cast<float>(i)) * ((i / 64) % 2 ? -1.0f : 1.0f);
    std::vector<float> logits(static_cast<size_t>(n * kVocab));
    fast_lm_head(w, hidden.data(), n, logits.data());
    std::vector<int64_t> ids(static_cast<size_t>(n));
    fast_lm_head_argmax(w, hidden.data(), n, ids.data());
    bool positive = false, negative = false;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * kVocab;
      ASSERT_EQ(row[700], row[2 * kLmHeadBlock + 52]);
      EXPECT_EQ(ids[static_cast<size_t>(i)], first_argmax(row, kVocab)) << "row " << i;
      EXPECT_EQ(ids[static_cast<size_t>(i)], row[700] > 0 ? 700 : 0) << "row " << i;
      (row[700] > 0 ? positive : negative) = true;
    }
    EXPECT_TRUE(positive && negative) << "the construction should produce both kinds of tie";
  }
}

TEST(FusedArgmaxPacked, DirectCallMatchesTheLogitsIncludingNaNRows) {
  for (Precision precision : {Precision::BF16, Precision::Int8}) {
    SCOPED_TRACE(precision_name(precision));
    Decoder d(config(true));
    d.init_weights(7);
    const FastWeights w = pack_fast_weights(d, precision);
    const int64_t n = 5;
    std::vector<float> hidden(static_cast<size_t>(n * 64));
    uint64_t x = 99;
    for (float& h : hidden) h = static_cast<float>((x = x * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    hidden[3 * 64 + 10] = std::numeric_limits<float>::quiet_NaN();  // row 3: NaN logits
    std::vector<float> logits(static_cast<size_t>(n * kVocab));
    fast_lm_head(w, hidden.data(), n, logits.data());
    for (int64_t limit : {int64_t{0}, int64_t{1}, int64_t{1500}, kVocab + 5}) {
      std::vector<int64_t> ids(static_cast<size_t>(n), -1);
      fast_lm_head_argmax(w, hidden.data(), n, ids.data(), limit);
      const int64_t lim = limit <= 0 || limit > kVocab ? kVocab : limit;
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(ids[static_cast<size_t>(i)], first_argmax(logits.data() + i * kVocab, lim)) << "row " << i << " limit " << limit;
    }
  }
}

TEST(FusedArgmaxErrors, BadCallsAreCorelmErrors) {
  Decoder d(config(true));
  d.init_weights(8);
  for (Precision p : {Precision::F32, Precision::BF16}) {
    d.prepare_inference(p);
    KVCache cache(d.config(), 2, 8);
    EXPECT_THROW(d.forward_cached_argmax(Tensor::from_vector(std::vector<int64_t>{}, {2, 0}), cache, {0, 1}), ValueError);
    EXPECT_THROW(d.forward_cached_argmax(Tensor::from_vector(std::vector<int64_t>{1, 2}, {2, 1}), cache, {0}), ValueError);
    EXPECT_THROW(d.forward_cached_argmax(Tensor::from_vector(std::vector<int64_t>{1, kVocab}, {2, 1}), cache, {0, 1}),
                 Error);  // fast path: IndexError naming the id; reference: the embedding's error
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, FusedArgmax, ::testing::Values(Precision::F32, Precision::BF16, Precision::Int8),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

}  // namespace
}  // namespace corelm::model
