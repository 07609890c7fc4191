// corelm perplexity (llama.cpp's method) against an independent computation on the op-based
// reference forward (Decoder::forward, no cache), its KL-divergence mode, bad input, and the CLI
// as a user runs it (the docs/PERPLEXITY.md example).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "common/model_factories.h"
#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/perplexity.h"
#include "pipeline_fixture.h"

namespace corelm::testing {
namespace {

constexpr int64_t kVocab = 96;
constexpr TokenId kBos = 1;

model::Decoder random_decoder(int64_t vocab = kVocab, uint64_t seed = 5) {
  model::Decoder d(tiny_decoder_config(vocab, 0.3));
  d.init_weights(seed);
  return d;
}

std::vector<TokenId> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<TokenId> t;
  for (int64_t x : random_ids(n, vocab, seed)) t.push_back(static_cast<TokenId>(x));
  return t;
}

// The method written out directly: each chunk through the full (uncached) forward, first token
// replaced by BOS, log-softmax in double, positions ctx/2 .. ctx-2 predicting the next token;
// then the mean, a two-pass sample variance and its standard error.
struct Reference {
  double ppl = 0, stderr_ = 0;
  int64_t count = 0;
};
Reference reference(const model::Decoder& d, const std::vector<TokenId>& tokens, std::optional<TokenId> bos,
                    int64_t ctx, int64_t chunks) {
  autograd::NoGradGuard no_grad;
  const int64_t V = d.config().vocab_size;
  std::vector<double> nlls;
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int64_t> ids(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    if (bos) ids[0] = *bos;
    const std::vector<float> logits = d.forward(Tensor::from_vector(ids, {1, ctx})).to_float_vector();
    for (int64_t i = ctx / 2; i <= ctx - 2; ++i) {
      const float* row = logits.data() + i * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      nlls.push_back(mx + std::log(sum) - row[tokens[static_cast<size_t>(c * ctx + i + 1)]]);
    }
  }
  double mean = 0;
  for (double x : nlls) mean += x;
  mean /= double(nlls.size());
  double ss = 0;
  for (double x : nlls) ss += (x - mean) * (x - mean);
  const double n = double(nlls.size());
  return {std::exp(mean), std::exp(mean) * std::sqrt(ss / (n - 1) / n), static_cast<int64_t>(nlls.size())};
}

TEST(Perplexity, MatchesTheUncachedReferenceForwardWithBos) {
  const model::Decoder d = random_decoder();
  const int64_t ctx = 32;
  const auto tokens = random_tokens(5 * ctx + 7, kVocab, 3);  // 5 whole chunks, a tail dropped
  pipeline::PerplexityOptions o;
  o.ctx = ctx;
  const auto r = pipeline::perplexity(d, tokens, kBos, o);
  const Reference ref = reference(d, tokens, kBos, ctx, 5);
  EXPECT_EQ(r.chunks, 5);
  EXPECT_EQ(r.count, ref.count);
  EXPECT_EQ(r.count, 5 * (ctx - 1 - ctx / 2));
  EXPECT_TRUE(r.bos);
  EXPECT_NEAR(r.ppl, ref.ppl, 1e-5 * ref.ppl);
  EXPECT_NEAR(r.ppl_stderr, ref.stderr_, 1e-4 * ref.stderr_);
  EXPECT_GT(r.ppl_stderr, 0);
  ASSERT_EQ(r.running_ppl.size(), 5u);
  EXPECT_DOUBLE_EQ(r.running_ppl.back(), r.ppl);
  EXPECT_NEAR(r.running_ppl.front(), reference(d, tokens, kBos, ctx, 1).ppl, 1e-5 * r.ppl);
  // Without BOS the first token of each chunk stays: a different (and still matching) result.
  const auto nobos = pipeline::perplexity(d, tokens, std::nullopt, o);
  EXPECT_NEAR(nobos.ppl, reference(d, tokens, std::nullopt, ctx, 5).ppl, 1e-5 * nobos.ppl);
  EXPECT_NE(nobos.ppl, r.ppl);
}

TEST(Perplexity, OddContextChunksLimitAndBatchInvariance) {
  const model::Decoder d = random_decoder();
  const int64_t ctx = 21;  // odd: first = 10, 10 scored per chunk
  const auto tokens = random_tokens(7 * ctx, kVocab, 9);
  pipeline::PerplexityOptions o;
  o.ctx = ctx;
  o.chunks = 4;
  const auto one = pipeline::perplexity(d, tokens, kBos, o);
  EXPECT_EQ(one.chunks, 4);
  EXPECT_EQ(one.count, 4 * 10);
  EXPECT_NEAR(one.ppl, reference(d, tokens, kBos, ctx, 4).ppl, 1e-5 * one.ppl);
  o.batch = 3;  // rows 3 + 1: each chunk's result must not depend on its neighbours
  const auto batched = pipeline::perplexity(d, tokens, kBos, o);
  EXPECT_EQ(batched.ppl, one.ppl);
  EXPECT_EQ(batched.running_ppl, one.running_ppl);
}

TEST(Perplexity, Bf16FastPathIsCloseToTheReference) {
  model::Decoder d = random_decoder();
  const auto tokens = random_tokens(4 * 32, kVocab, 4);
  pipeline::PerplexityOptions o;
  o.ctx = 32;
  const double ref = pipeline::perplexity(d, tokens, kBos, o).ppl;
  d.prepare_inference(model::Precision::BF16);
  const double fast = pipeline::perplexity(d, tokens, kBos, o).ppl;
  EXPECT_NEAR(fast, ref, 2e-2 * ref);
}

class PerplexityFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_ppl_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(PerplexityFiles, KldOfAFileAgainstItselfIsZeroAndBf16IsSmallButPositive) {
  model::Decoder d = random_decoder();
  const int64_t ctx = 32;
  const auto tokens = random_tokens(6 * ctx, kVocab, 6);
  pipeline::PerplexityOptions o;
  o.ctx = ctx;
  o.save_logits = path("base.bin");
  const auto base = pipeline::perplexity(d, tokens, kBos, o);
  const int64_t n_scored = ctx - 1 - ctx / 2;
  EXPECT_EQ(fs::file_size(o.save_logits), 40u + 6u * ctx * 4 + 6u * n_scored * kVocab * 4);
  o.save_logits.clear();
  o.kl_base = path("base.bin");
  const auto self = pipeline::perplexity(d, tokens, kBos, o);
  ASSERT_TRUE(self.kld);
  EXPECT_EQ(self.kld->mean_kld, 0.0);
  EXPECT_EQ(self.kld->max_kld, 0.0);
  EXPECT_EQ(self.kld->same_top, 1.0);
  EXPECT_EQ(self.kld->delta_ppl, 0.0);
  EXPECT_EQ(self.kld->delta_ppl_stderr, 0.0);
  EXPECT_NEAR(self.kld->base_ppl, base.ppl, 1e-5 * base.ppl);  // stored log-probs are f32
  EXPECT_NEAR(self.kld->nll_correlation, 1.0, 1e-6);

  d.prepare_inference(model::Precision::BF16);
  const auto q = pipeline::perplexity(d, tokens, kBos, o);
  ASSERT_TRUE(q.kld);
  const auto& k = *q.kld;
  EXPECT_GT(k.mean_kld, 0.0);
  EXPECT_LT(k.mean_kld, 1e-2);
  EXPECT_GT(k.mean_kld_stderr, 0.0);
  EXPECT_GE(k.max_kld, k.p99_kld);
  EXPECT_GE(k.p99_kld, k.median_kld);
  EXPECT_GT(k.same_top, 0.8);
  EXPECT_NEAR(k.ppl, q.ppl, 1e-5 * q.ppl);  // NLLs from the f32 log-probs
  EXPECT_DOUBLE_EQ(k.delta_ppl, k.ppl - k.base_ppl);
  std::printf("bf16 vs f32: PPL %.4f vs %.4f, delta %.6f +/- %.6f, KLD %.3g, same top %.3f\n", k.ppl, k.base_ppl,
              k.delta_ppl, k.delta_ppl_stderr, k.mean_kld, k.same_top);
  // The paired error is far below the two PPL errors combined as if independent.
  EXPECT_GT(k.delta_ppl_stderr, 0.0);
  EXPECT_LT(k.delta_ppl_stderr, 0.2 * std::hypot(k.ppl_stderr, k.base_ppl_stderr));
  EXPECT_NEAR(k.delta_ln_ppl, std::log(k.ppl / k.base_ppl), 1e-9);
}

TEST_F(PerplexityFiles, RefusesTooShortTextsContextsAboveTheModelAndForeignBaseFiles) {
  const model::Decoder d = random_decoder();
  pipeline::PerplexityOptions o;
  o.ctx = 32;
  // Fewer than 2 * ctx tokens: llama.cpp refuses, so do we.
  try {
    pipeline::perplexity(d, random_tokens(63, kVocab, 1), kBos, o);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("at least 64 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("only 63"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pipeline::perplexity(d, {}, kBos, o), ValueError);
  o.ctx = 65;  // the model's context is 64
  try {
    pipeline::perplexity(d, random_tokens(400, kVocab, 1), kBos, o);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings 64"), std::string::npos) << e.what();
  }

  const auto tokens = random_tokens(4 * 32, kVocab, 2);
  o.ctx = 32;
  o.save_logits = path("base.bin");
  pipeline::perplexity(d, tokens, kBos, o);
  o.save_logits.clear();
  o.kl_base = path("base.bin");
  const auto expect_format_error = [&](const model::Decoder& dec, const std::vector<TokenId>& t,
                                       std::optional<TokenId> bos, const std::string& needle) {
    try {
      pipeline::perplexity(dec, t, bos, o);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto other = tokens;
  other[40] = (other[40] + 1) % kVocab;
  expect_format_error(d, other, kBos, "first difference at token 40");
  expect_format_error(d, tokens, std::nullopt, "with BOS at chunk starts");
  expect_format_error(random_decoder(kVocab + 4), tokens, kBos, "vocabulary of 96");
  o.ctx = 16;
  expect_format_error(d, tokens, kBos, "--ctx 32");
  o.ctx = 32;
  fs::resize_file(path("base.bin"), fs::file_size(path("base.bin")) - 4);
  expect_format_error(d, tokens, kBos, "truncated");
  // Damaged rows (right size, wrong numbers): a NaN, a positive log-probability, a row that does
  // not sum to 1. Each names the chunk and position instead of returning a NaN or wrong KL.
  o.save_logits = path("base.bin");
  o.kl_base.clear();
  pipeline::perplexity(d, tokens, kBos, o);
  o.save_logits.clear();
  o.kl_base = path("base.bin");
  const std::string good = [&] {
    std::ifstream in(path("base.bin"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const size_t header = 8 + 32, rows_at = header + 4 * 32 * 4;  // 4 chunks of 32 tokens
  const size_t row_bytes = size_t{kVocab} * 4, scored = 32 - 1 - 16;
  const float nan = std::nanf(""), positive = 0.5f;
  const std::pair<size_t, float> damage[] = {{rows_at + 3 * 4, nan},
                                             {rows_at + (scored + 2) * row_bytes + 7 * 4, positive},
                                             {rows_at + (2 * scored + 5) * row_bytes, -30.0f}};
  const char* where[] = {"chunk 0, scored position 0", "chunk 1, scored position 2", "chunk 2, scored position 5"};
  for (size_t i = 0; i < 3; ++i) {
    std::string bad = good;
    std::memcpy(bad.data() + damage[i].first, &damage[i].second, 4);
    std::ofstream(path("bad.bin"), std::ios::binary) << bad;
    o.kl_base = path("bad.bin");
    expect_format_error(d, tokens, kBos, where[i]);
  }
  std::ofstream(path("junk.bin")) << "not a log-probability file at all, just text";
  o.kl_base = path("junk.bin");
  expect_format_error(d, tokens, kBos, "not a corelm log-probability file");
}

// The CLI as docs/PERPLEXITY.md shows it: a model directory with a trained BPE tokenizer.
class PerplexityCli : public PipelineTest {};

TEST_F(PerplexityCli, DocumentedExampleSavesAndComparesLogProbabilities) {
  if (!fs::exists(corelm_path())) GTEST_SKIP() << corelm_path() << " is not built (build target corelm_cli)";
  std::mt19937 rng(3);
  std::string text;
  for (int i = 0; i < 60; ++i) text += words(rng, 14) + ".\n";
  write_text(root_ / "text.txt", text);
  const std::string base = path("f32.logp");
  CliResult r = run_corelm({"perplexity", "--model", model_, "--file", path("text.txt"), "--ctx", "64", "--precision",
                            "f32", "--save-logits", base, "--json"});
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j.at("ppl").get<double>(), 1.0);
  EXPECT_GT(j.at("ppl_stderr").get<double>(), 0.0);
  EXPECT_EQ(j.at("ctx"), 64);
  EXPECT_EQ(j.at("scored"), j.at("chunks").get<int64_t>() * 31);
  EXPECT_EQ(j.at("running").size(), j.at("chunks").get<size_t>());
  EXPECT_EQ(j.at("type_k"), "f32");
  EXPECT_NE(r.err.find("chunks/s"), std::string::npos) << r.err;  // the progress line
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(base));

  r = run_corelm({"perplexity", "--model", model_, "--file", path("text.txt"), "--ctx", "64", "--precision", "bf16",
                  "--kl-base", base, "--json"});
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto k = nlohmann::json::parse(r.out).at("kld");
  EXPECT_GT(k.at("mean_kld").get<double>(), 0.0);
  EXPECT_LE(k.at("p99_kld").get<double>(), k.at("max_kld").get<double>());
  EXPECT_GT(k.at("same_top_pct").get<double>(), 50.0);
  EXPECT_NEAR(k.at("base_ppl").get<double>(), j.at("ppl").get<double>(), 1e-4 * j.at("ppl").get<double>());

  // Bad input: one clear line, exit 1.
  write_text(root_ / "short.txt", "the cat sat");
  r = run_corelm({"perplexity", "--model", model_, "--file", path("short.txt"), "--ctx", "64"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("you need at least 128 tokens"), std::string::npos) << r.err;
  r = run_corelm({"perplexity", "--model", model_, "--file", path("text.txt"), "--ctx", "32", "--kl-base", base});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--ctx 64"), std::string::npos) << r.err;
  r = run_corelm({"perplexity", "--model", model_, "--file", path("text.txt"), "--ctx", "512"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("max_position_embeddings"), std::string::npos) << r.err;
  r = run_corelm({"perplexity", "--model", model_, "--file", path("text.txt"), "--cache-type-k", "q9"});
  EXPECT_EQ(r.rc, 1);
}

}  // namespace
}  // namespace corelm::testing
