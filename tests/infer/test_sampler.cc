// Sampler unit tests on handcrafted logits: each knob against the numbers Hugging Face's logits
// processors give for the same input.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/random.h"

namespace corelm::infer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> example_logits() { return {0.5f, 2.0f, -1.0f, 1.9f, 0.0f, -3.0f, 1.0f, 0.2f}; }

TokenId draw(const SamplingOptions& o, uint64_t seed, std::vector<float> logits, std::vector<TokenId> context = {}) {
  Sampler s(o, seed);
  return s.sample(logits, context);
}

TEST(Sampler, GreedyIsArgmaxFirstOnTies) {
  SamplingOptions o;
  o.greedy = true;
  EXPECT_EQ(draw(o, 0, example_logits()), 1);
  EXPECT_EQ(draw(o, 0, {1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-5.0f, -4.0f, -4.5f}), 1);
}

TEST(Sampler, TopK1TopPTinyAndTemperatureZeroAreGreedy) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SamplingOptions k1;
    k1.top_k = 1;
    EXPECT_EQ(draw(k1, seed, example_logits()), 1);
    SamplingOptions p;
    p.top_p = 1e-6f;
    EXPECT_EQ(draw(p, seed, example_logits()), 1);
    SamplingOptions t0;
    t0.temperature = 0.0f;
    EXPECT_EQ(draw(t0, seed, example_logits()), 1);
    SamplingOptions tiny_t;
    tiny_t.temperature = 1e-4f;
    EXPECT_EQ(draw(tiny_t, seed, example_logits()), 1);
  }
}

// Issue 13 defect 13: 1e-38 passed the "> 0" check, logits / 1e-38 overflowed to +inf, the
// softmax became NaN and the draw fell through to the last candidate (id 7 here) every time.
TEST(Sampler, TemperaturesBelowTheEpsilonAreGreedy) {
  for (float t : {1e-38f, 1e-30f, 1e-10f, 0.99e-5f, std::numeric_limits<float>::denorm_min()}) {
    SamplingOptions o;
    o.temperature = t;
    EXPECT_TRUE(o.is_greedy()) << t;
    for (uint64_t seed = 0; seed < 10; ++seed) EXPECT_EQ(draw(o, seed, example_logits()), 1) << "temperature " << t;
  }
  SamplingOptions at_eps;
  at_eps.temperature = kGreedyTemperature;
  EXPECT_FALSE(at_eps.is_greedy()) << "the epsilon itself still samples";
}

// Just above the epsilon, a huge logit still overflows float when scaled: the overflowing tokens
// keep the mass instead of the softmax turning into NaN.
TEST(Sampler, OverflowingScaledLogitsStayDefined) {
  SamplingOptions o;
  o.temperature = 2e-5f;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    EXPECT_EQ(draw(o, seed, {0.0f, 1e35f, -1e35f, 5.0f}), 1);
    std::vector<float> logits{0.0f, 1e35f, 2.0f};
    warp_logits(logits, {}, o);
    for (float x : logits) EXPECT_FALSE(std::isnan(x));
  }
}

TEST(Sampler, NonFiniteAndOutOfRangeOptionsAreRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto refused = [](auto set) {
    SamplingOptions o;
    set(o);
    try {
      o.validate();
    } catch (const ValueError&) {
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.temperature = nan; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.temperature = inf; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.temperature = -1e-38f; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.top_p = nan; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.top_p = 1.0001f; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.top_p = -0.5f; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.min_p = nan; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.min_p = -0.1f; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.repetition_penalty = nan; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.repetition_penalty = -1.0f; }));
  EXPECT_TRUE(refused([&](SamplingOptions& o) { o.no_repeat_ngram_size = -1; }));
  EXPECT_FALSE(refused([&](SamplingOptions& o) { o.temperature = 0.0f; }));
  EXPECT_FALSE(refused([&](SamplingOptions& o) { o.top_p = 1.0f; }));
}

// Frequencies over many draws: which tokens ever appear.
std::map<TokenId, int> histogram(const SamplingOptions& o, int n = 4000) {
  Sampler s(o, 123);
  std::map<TokenId, int> h;
  for (int i = 0; i < n; ++i) {
    auto logits = example_logits();
    ++h[s.sample(logits, {})];
  }
  return h;
}

TEST(Sampler, TopKKeepsOnlyKBest) {
  SamplingOptions o;
  o.top_k = 3;  // tokens 1 (2.0), 3 (1.9), 6 (1.0)
  auto h = histogram(o);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_TRUE(h.count(1) && h.count(3) && h.count(6));
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // softmax of example_logits: p(1) ~ .351, p(3) ~ .317, p(6) ~ .129, p(0) ~ .078, ...
  // HF drops tokens from the bottom while their cumulative mass stays <= 1 - top_p.
  SamplingOptions o;
  o.top_p = 0.5f;  // the bottom six sum to .332 <= .5, adding token 3 gives .650 > .5
  auto h = histogram(o);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(1) && h.count(3));
  o.top_p = 0.7f;  // the bottom five sum to .203 <= .3, token 6 brings .332 > .3
  EXPECT_EQ(histogram(o).size(), 3u);
}

TEST(Sampler, MinPDropsTokensBelowFractionOfBest) {
  // p(x) / p_max = exp(x - 2): 1.9 -> .905, 1.0 -> .368, 0.5 -> .223, 0.2 -> .165
  SamplingOptions o;
  o.min_p = 0.3f;
  auto h = histogram(o);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_TRUE(h.count(1) && h.count(3) && h.count(6));
  o.min_p = 0.95f;
  EXPECT_EQ(histogram(o).size(), 1u);
}

TEST(Sampler, SamplingFollowsTheDistribution) {
  SamplingOptions o;
  std::vector<float> l = {0.0f, std::log(3.0f)};  // p = .25, .75
  Sampler s(o, 7);
  int ones = 0, n = 20000;
  for (int i = 0; i < n; ++i) {
    auto x = l;
    ones += s.sample(x, {}) == 1;
  }
  EXPECT_NEAR(double(ones) / n, 0.75, 0.015);
}

TEST(Sampler, RepetitionPenaltyMath) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, -0.5f, 3.0f};
  std::vector<TokenId> ctx = {0, 1, 1, 3};  // duplicates are penalised once
  apply_repetition_penalty(l, ctx, 2.0f);
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], -4.0f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
  EXPECT_FLOAT_EQ(l[3], -1.0f);
  EXPECT_FLOAT_EQ(l[4], 3.0f);
  // The penalty changes the greedy choice: 4 / 4 = 1 falls below the untouched 1.5.
  SamplingOptions o;
  o.greedy = true;
  o.repetition_penalty = 4.0f;
  EXPECT_EQ(draw(o, 0, {4.0f, 0.0f, 1.5f}, {0}), 2);
}

TEST(Sampler, NoRepeatNgramBansTheRightToken) {
  // Sequence 5 6 7 ... 5 6: the 3-gram (5 6 7) exists, so after "5 6" token 7 is banned.
  std::vector<TokenId> ctx = {5, 6, 7, 1, 5, 6};
  std::vector<float> l(10, 0.0f);
  ban_repeated_ngrams(l, ctx, 3);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(l[i] == kNegInf, i == 7) << i;
  // 2-grams: prefix is "6"; (6 7) occurred -> 7 banned.
  std::vector<float> l2(10, 0.0f);
  ban_repeated_ngrams(l2, ctx, 2);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(l2[i] == kNegInf, i == 7) << i;
  // 1-grams ban every token seen.
  std::vector<float> l1(10, 0.0f);
  ban_repeated_ngrams(l1, ctx, 1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(l1[i] == kNegInf, i == 1 || i == 5 || i == 6 || i == 7) << i;
  // Too short a context bans nothing.
  std::vector<float> l4(10, 0.0f);
  ban_repeated_ngrams(l4, std::vector<TokenId>{5, 6}, 4);
  for (float x : l4) EXPECT_EQ(x, 0.0f);
  // Greedy respects the ban: token 7 is the best but banned, the next best wins.
  SamplingOptions o;
  o.greedy = true;
  o.no_repeat_ngram_size = 3;
  std::vector<float> g(10, 0.0f);
  g[7] = 5.0f;
  g[2] = 1.0f;
  EXPECT_EQ(draw(o, 0, g, ctx), 2);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  SamplingOptions o;
  o.temperature = 1.5f;
  std::vector<float> flat(64);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = 0.01f * float(i % 7);
  auto run = [&](uint64_t seed) {
    Sampler s(o, seed);
    std::vector<TokenId> out;
    for (int i = 0; i < 32; ++i) {
      auto x = flat;
      out.push_back(s.sample(x, {}));
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

// The sampler sorts a whole vocabulary for top-p with a radix sort; this is the plain
// std::sort version of the same draw (HF's top-p, softmax in double, one uniform per token), and
// both must pick the same tokens, ties (many equal logits, -0 and +0) included.
TokenId top_p_reference(std::vector<float> logits, float temperature, float top_p, Generator& gen) {
  std::vector<std::pair<float, TokenId>> c;
  for (size_t i = 0; i < logits.size(); ++i) c.emplace_back(logits[i] / temperature, static_cast<TokenId>(i));
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  auto probs = [&] {
    std::vector<double> p(c.size());
    double top = c.front().first, total = 0;
    for (const auto& x : c) top = std::max(top, double(x.first));
    for (size_t i = 0; i < c.size(); ++i) total += p[i] = std::exp(double(c[i].first) - top);
    for (double& x : p) x /= total;
    return p;
  };
  std::vector<double> p = probs();
  double cumulative = 0;
  size_t keep = c.size();
  for (size_t i = c.size(); i-- > 1;) {
    cumulative += p[i];
    if (cumulative <= 1.0 - double(top_p)) keep = i;
    else break;
  }
  c.resize(keep);
  p = probs();
  double u = gen.uniform();
  cumulative = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    cumulative += p[i];
    if (u < cumulative) return c[i].second;
  }
  return c.back().second;
}

TEST(Sampler, TopPOverAWholeVocabularyDrawsAsAFullSort) {
  SamplingOptions o;
  o.temperature = 0.7f;
  o.top_p = 0.9f;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    std::vector<float> logits(3000);
    uint64_t x = seed * 2654435761u + 1;
    for (auto& l : logits) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      l = float(int64_t(x % 41) - 20) * 0.25f;  // few distinct values: many ties
      if (x % 97 == 0) l = (x & 1) ? -0.0f : 0.0f;
    }
    Sampler s(o, seed);
    Generator g(seed);
    for (int step = 0; step < 5; ++step) {
      auto a = logits;
      EXPECT_EQ(s.sample(a, {}), top_p_reference(logits, o.temperature, o.top_p, g)) << "seed " << seed << " step " << step;
    }
  }
}

TEST(Sampler, AllowedVocabMasksPaddedIds) {
  SamplingOptions o;
  o.greedy = true;
  Sampler s(o, 0);
  std::vector<float> l = {0.0f, 1.0f, 2.0f, 9.0f};
  EXPECT_EQ(s.sample(l, {}, 3), 2);
}

TEST(Sampler, InvalidOptionsAreValueErrors) {
  SamplingOptions o;
  o.top_p = 0.0f;
  EXPECT_THROW(Sampler(o, 0), ValueError);
  o = {};
  o.temperature = -1.0f;
  EXPECT_THROW(Sampler(o, 0), ValueError);
  o = {};
  o.top_k = -2;
  EXPECT_THROW(Sampler(o, 0), ValueError);
  o = {};
  o.min_p = 1.5f;
  EXPECT_THROW(Sampler(o, 0), ValueError);
  o = {};
  o.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler(o, 0), ValueError);
}

// Every knob against Hugging Face's processors/warpers on random logits: the same tokens survive
// with the same scores. Skips when the oracle Python has no transformers.
TEST(SamplerOracle, WarpedLogitsMatchHuggingFace) {
  Generator gen(2024);
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::pair<std::vector<float>, std::vector<TokenId>>> inputs;
  std::vector<SamplingOptions> options;
  for (int i = 0; i < 60; ++i) {
    const int v = 40;
    std::vector<float> logits(v);
    for (float& x : logits) x = 2.0f * gen.normal();
    logits[gen.below(v)] = logits[gen.below(v)];  // a tie now and then
    std::vector<TokenId> context(6 + gen.below(10));
    for (TokenId& t : context) t = static_cast<TokenId>(gen.below(i % 2 ? 5 : v));  // small alphabets repeat n-grams
    SamplingOptions o;
    o.temperature = std::vector<float>{1.0f, 0.7f, 1.3f}[i % 3];
    o.top_k = std::vector<int64_t>{0, 1, 5, 12}[i % 4];
    o.top_p = std::vector<float>{1.0f, 0.9f, 0.5f, 0.2f, 0.75f}[i % 5];
    o.min_p = std::vector<float>{0.0f, 0.05f, 0.3f}[(i / 3) % 3];
    o.repetition_penalty = std::vector<float>{1.0f, 1.3f, 0.8f}[(i / 2) % 3];
    o.no_repeat_ngram_size = std::vector<int64_t>{0, 1, 2, 3}[(i / 5) % 4];
    cases.push_back({{"logits", logits},
                     {"context", context},
                     {"options",
                      {{"temperature", o.temperature}, {"top_k", o.top_k}, {"top_p", o.top_p}, {"min_p", o.min_p},
                       {"repetition_penalty", o.repetition_penalty}, {"no_repeat_ngram_size", o.no_repeat_ngram_size}}}});
    inputs.emplace_back(logits, context);
    options.push_back(o);
  }
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("corelm_sampler_oracle_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in.json") << cases.dump();
  std::string cmd = std::string(CORELM_TEST_PYTHON) + " " + CORELM_SOURCE_DIR + "/tests/infer/hf_sampling_oracle.py " +
                    (dir / "in.json").string() + " " + (dir / "out.json").string();
  int rc = std::system(cmd.c_str());
  if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) == 77 || WEXITSTATUS(rc) == 127) {
    fs::remove_all(dir);
    GTEST_SKIP() << "no Python with transformers (" << CORELM_TEST_PYTHON << ")";
  }
  ASSERT_EQ(WEXITSTATUS(rc), 0) << cmd;
  nlohmann::json out = nlohmann::json::parse(std::ifstream(dir / "out.json"));
  fs::remove_all(dir);
  ASSERT_EQ(out.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto logits = inputs[i].first;
    warp_logits(logits, inputs[i].second, options[i]);
    auto kept = out[i]["kept"].get<std::vector<bool>>();
    auto scores = out[i]["scores"].get<std::vector<float>>();
    for (size_t t = 0; t < logits.size(); ++t) {
      ASSERT_EQ(logits[t] != kNegInf, bool(kept[t])) << "case " << i << " token " << t << ": " << cases[i]["options"].dump();
      if (kept[t]) {
        EXPECT_NEAR(logits[t], scores[t], 1e-5f * std::max(1.0f, std::fabs(scores[t]))) << "case " << i;
      }
    }
  }
}

}  // namespace
}  // namespace corelm::infer
