// Generation end to end on a small random model and a BPE tokenizer trained in the test: KV cache
// vs full recompute, batched vs alone, stop strings, EOS, context policy, streaming.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/tokenizer.h"
#include "common/generate_fixtures.h"
#include "common/model_factories.h"

namespace corelm::infer {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kWeightSeed = 1234;

// A few kilobytes of pseudo-text with multi-byte characters, so the tokenizer learns merges and the
// byte-level model can produce incomplete characters.
std::string training_text() {
  const std::vector<std::string> words = {"the",   "cat", "sat", "on", "a",    "mat", "café",
                                          "naïve", "日本", "語",  "über", "and", "dog", "ran"};
  return testing::pseudo_text(words, 88172645463325252ull, 3000, 11);
}

model::ModelConfig small_config(int64_t vocab) { return testing::tiny_decoder_config(vocab, 0.2); }

class GenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::path dir = fs::temp_directory_path() / ("corelm_infer_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    tokenizer_ = testing::train_small_bpe(dir, training_text(), 300).release();
    std::ifstream in(dir / "tokenizer.json", std::ios::binary);
    tokenizer_json_ = new std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove_all(dir);
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
    delete tokenizer_json_;
    tokenizer_json_ = nullptr;
  }

  static std::unique_ptr<model::Decoder> make_model(model::ModelConfig c) {
    auto d = std::make_unique<model::Decoder>(c);
    d->init_weights(kWeightSeed);
    return d;
  }
  static std::unique_ptr<model::Decoder> make_model() { return make_model(small_config(tokenizer_->vocab_size())); }

  static GenerateOptions greedy(int64_t n) { return testing::greedy_options(n); }

  static std::vector<TokenId> ids(const std::string& text) { return tokenizer_->encode(text); }

  static Tokenizer* tokenizer_;
  static std::string* tokenizer_json_;
};
Tokenizer* GenerateTest::tokenizer_ = nullptr;
std::string* GenerateTest::tokenizer_json_ = nullptr;

// Reference: greedy decoding that recomputes the whole sequence each step (no cache).
std::vector<TokenId> greedy_uncached(const model::Decoder& d, std::vector<TokenId> seq, int64_t n) {
  autograd::NoGradGuard no_grad;
  std::vector<TokenId> out;
  const int64_t v = d.config().vocab_size;
  for (int64_t step = 0; step < n; ++step) {
    const int64_t t = static_cast<int64_t>(seq.size());
    Tensor logits = d.forward(Tensor::from_vector(seq, {1, t})).contiguous();
    const float* last = logits.data<float>() + (t - 1) * v;
    TokenId next = argmax(std::span<const float>(last, static_cast<size_t>(v)));
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += len;
  }
  return true;
}

TEST_F(GenerateTest, KVCacheGreedyEqualsFullRecompute) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  for (const std::string prompt : {"the cat sat", "日本 café and the dog ran on a mat"}) {
    auto p = ids(prompt);
    auto r = gen.generate_ids({p}, greedy(24)).front();
    ASSERT_EQ(r.tokens.size(), 24u);
    EXPECT_EQ(r.tokens, greedy_uncached(*d, p, 24)) << prompt;
    std::set<TokenId> distinct(r.tokens.begin(), r.tokens.end());
    EXPECT_GE(distinct.size(), 4u) << "a degenerate sequence would make the comparison weak";
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(p.size()));
  }
}

TEST_F(GenerateTest, BatchedEqualsEachAlone) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  std::vector<std::vector<TokenId>> prompts = {ids("the"), ids("über naïve café and the dog sat on a mat"), ids("a cat ran.")};
  ASSERT_NE(prompts[0].size(), prompts[1].size());
  for (bool sampled : {false, true}) {
    GenerateOptions o = greedy(16);
    if (sampled) {
      o.sampling.greedy = false;
      o.sampling.temperature = 0.9f;
      o.sampling.top_k = 50;
      o.seed = 77;
    }
    // Different lengths also make rows finish at different steps.
    o.max_new_tokens = 16;
    auto batch = gen.generate_ids(prompts, o);
    ASSERT_EQ(batch.size(), 3u);
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto alone = gen.generate_ids({prompts[i]}, o).front();
      EXPECT_EQ(batch[i].tokens, alone.tokens) << "prompt " << i << (sampled ? " sampled" : " greedy");
      EXPECT_EQ(batch[i].text, alone.text);
    }
  }
}

TEST_F(GenerateTest, BatchedRowsFinishingEarlyDropOut) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  // The longer prompt runs into the context (64) after a few tokens; the others go on.
  std::vector<TokenId> long_prompt;
  while (long_prompt.size() < 60) long_prompt.push_back(static_cast<TokenId>(40 + long_prompt.size() % 50));
  std::vector<std::vector<TokenId>> prompts = {ids("the cat"), long_prompt, ids("dog")};
  auto batch = gen.generate_ids(prompts, greedy(12));
  EXPECT_EQ(batch[1].tokens.size(), 4u);
  EXPECT_EQ(batch[1].finish_reason, "length");
  for (size_t i : {0u, 2u}) {
    EXPECT_EQ(batch[i].tokens.size(), 12u);
    EXPECT_EQ(batch[i].tokens, greedy_uncached(*d, prompts[i], 12));
  }
}

TEST_F(GenerateTest, SameSeedSameOutputDifferentSeedDifferent) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  GenerateOptions o;
  o.max_new_tokens = 20;
  o.sampling.temperature = 1.0f;
  o.seed = 5;
  auto a = gen.generate("the cat", o);
  auto b = gen.generate("the cat", o);
  o.seed = 6;
  auto c = gen.generate("the cat", o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, c.tokens);
}

TEST_F(GenerateTest, StopStringCutsTextAndIsNotIncluded) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  auto full = gen.generate("the dog", greedy(40));
  ASSERT_GE(full.text.size(), 8u);
  // A stop string taken from the middle of the unconstrained output, on character boundaries.
  size_t start = full.text.size() / 3;
  while (start < full.text.size() && (static_cast<unsigned char>(full.text[start]) >> 6) == 0x2) ++start;
  size_t end = start + 1;
  while (end < full.text.size() && (static_cast<unsigned char>(full.text[end]) >> 6) == 0x2) ++end;
  ASSERT_LT(start, full.text.size());
  std::string stop = full.text.substr(start, end - start);
  GenerateOptions o = greedy(40);
  o.stop = {"this never appears \x01", stop};
  std::string streamed;
  auto r = gen.generate("the dog", o, [&](size_t, std::string_view piece) { streamed += piece; });
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(streamed, r.text);
  EXPECT_LT(r.tokens.size(), full.tokens.size());
}

TEST_F(GenerateTest, StopsAtEos) {
  auto base = make_model();
  TextGenerator gen0(*base, *tokenizer_);
  auto full = gen0.generate_ids({ids("a mat")}, greedy(20)).front();
  ASSERT_EQ(full.tokens.size(), 20u);
  TokenId eos = full.tokens[5];
  size_t first = std::find(full.tokens.begin(), full.tokens.end(), eos) - full.tokens.begin();

  auto c = small_config(tokenizer_->vocab_size());
  c.eos_token_id = eos;
  auto d = make_model(c);
  TextGenerator gen(*d, *tokenizer_);
  GenerateOptions o = greedy(20);
  o.stop_at_eos = true;
  auto r = gen.generate_ids({ids("a mat")}, o).front();
  EXPECT_EQ(r.finish_reason, "stop");
  ASSERT_EQ(r.tokens.size(), first + 1);
  EXPECT_EQ(r.tokens.back(), eos);
  // The EOS token itself contributes no text.
  std::vector<TokenId> before(full.tokens.begin(), full.tokens.begin() + first);
  std::string expected;
  StreamingDecoder sd(*tokenizer_);
  for (TokenId t : before) expected += sd.push(t);
  expected += sd.flush();
  EXPECT_EQ(r.text, expected);
  // With stop_at_eos off, generation runs on.
  o.stop_at_eos = false;
  EXPECT_EQ(gen.generate_ids({ids("a mat")}, o).front().tokens.size(), 20u);
}

TEST_F(GenerateTest, PromptOverContextIsAClearError) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  std::vector<TokenId> p(100, 70);
  try {
    gen.generate_ids({p}, greedy(10));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("100 tokens"), std::string::npos) << what;
    EXPECT_NE(what.find("context is 64"), std::string::npos) << what;
    EXPECT_NE(what.find("--truncate left"), std::string::npos) << what;
  }
}

TEST_F(GenerateTest, TruncateLeftKeepsTheLastTokens) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  std::vector<TokenId> p;
  for (int i = 0; i < 100; ++i) p.push_back(static_cast<TokenId>(30 + (i * 7) % 200));
  GenerateOptions o = greedy(10);
  o.truncate = Truncate::Left;
  auto r = gen.generate_ids({p}, o).front();
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.prompt_tokens, 54);  // 64 - 10
  EXPECT_EQ(r.tokens.size(), 10u);
  std::vector<TokenId> tail(p.end() - 54, p.end());
  EXPECT_EQ(r.tokens, greedy_uncached(*d, tail, 10));
}

TEST_F(GenerateTest, GenerationStopsAtTheContext) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  std::vector<TokenId> p(60, 101);
  auto r = gen.generate_ids({p}, greedy(50)).front();
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.tokens.size(), 4u);  // prompt + generated == context
  std::vector<TokenId> full(64, 101);
  auto at_limit = gen.generate_ids({full}, greedy(5)).front();
  EXPECT_TRUE(at_limit.tokens.empty());
  EXPECT_EQ(at_limit.finish_reason, "length");
}

TEST_F(GenerateTest, StreamingPiecesAreValidUtf8AndConcatenateToText) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  GenerateOptions o;
  o.max_new_tokens = 60;
  o.sampling.temperature = 1.0f;
  o.stop_at_eos = false;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    o.seed = seed;
    std::vector<std::string> pieces(2);
    auto rs = gen.generate(std::vector<std::string>{"日本", "café über"}, o, [&](size_t i, std::string_view piece) {
      EXPECT_FALSE(piece.empty());
      EXPECT_TRUE(valid_utf8(piece)) << "seed " << seed;
      pieces.at(i) += piece;
    });
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(pieces[i], rs[i].text);
      EXPECT_TRUE(valid_utf8(rs[i].text));
    }
  }
}

// SentencePiece drops the leading space of a text's first token; a continuation must keep it, so
// the generated text is exactly what decode(prompt + output) adds after decode(prompt).
TEST_F(GenerateTest, SentencePieceContinuationKeepsItsLeadingSpace) {
  const std::string path = std::string(CORELM_SOURCE_DIR) + "/../shared/data/tokenizers/llama2/tokenizer.model";
  if (!fs::exists(path)) GTEST_SKIP() << path << " not present";
  auto spm = Tokenizer::load(path);
  ASSERT_TRUE(spm->strips_leading_space());
  auto d = make_model(small_config(static_cast<int64_t>(spm->vocab_size())));
  TextGenerator gen(*d, *spm);
  GenerateOptions o = greedy(8);
  o.add_special = false;
  auto prompt = spm->encode("Hello world");
  auto r = gen.generate_ids({prompt}, o).front();
  std::vector<TokenId> all = prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  std::string full = spm->decode(all, true), head = spm->decode(prompt, true);
  if (!valid_utf8(full)) GTEST_SKIP() << "the random model produced a partial character";
  ASSERT_EQ(full.substr(0, head.size()), head);
  EXPECT_EQ(r.text, full.substr(head.size()));
  EXPECT_EQ(r.text.substr(0, 1), " ") << "this model's first generated piece starts a word";
}

// The path `corelm generate` takes: a model directory written by save_model_dir, loaded back.
TEST_F(GenerateTest, ModelDirectoryRoundTripGeneratesTheSame) {
  auto d = make_model();
  fs::path dir = fs::temp_directory_path() / ("corelm_infer_modeldir_" + std::to_string(::getpid()));
  model::save_model_dir(dir.string(), *d);
  std::ofstream(dir / "tokenizer.json", std::ios::binary) << *tokenizer_json_;
  model::LoadedModel m = model::load_model_dir(dir.string());
  fs::remove_all(dir);
  TextGenerator a(*d, *tokenizer_), b(m.decoder, *m.tokenizer);
  GenerateOptions o = greedy(12);
  EXPECT_EQ(a.generate("the cat sat on", o).tokens, b.generate("the cat sat on", o).tokens);
  o.sampling.greedy = false;
  o.sampling.top_p = 0.9f;
  o.seed = 11;
  EXPECT_EQ(a.generate("the cat sat on", o).text, b.generate("the cat sat on", o).text);
}

TEST_F(GenerateTest, BadOptionsAndPromptsAreValueErrors) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  GenerateOptions o = greedy(5);
  EXPECT_THROW(gen.generate_ids({{}}, o), ValueError);
  EXPECT_THROW(gen.generate_ids({{100000}}, o), ValueError);
  o.stop = {""};
  EXPECT_THROW(gen.generate_ids({{5}}, o), ValueError);
  o = greedy(5);
  o.max_new_tokens = -1;
  EXPECT_THROW(gen.generate_ids({{5}}, o), ValueError);
  o = greedy(5);
  o.sampling.top_p = 2.0f;
  EXPECT_THROW(gen.generate_ids({{5}}, o), ValueError);
}

}  // namespace
}  // namespace corelm::infer

namespace corelm::infer {
namespace {

// Issue 13, defect 8: the KV cache held the whole context per prompt, so a model whose config
// said 2^31-1 positions could not generate at all (now the largest context a config may give). The cache now holds prompt + max_new_tokens;
// the same model generates exactly what a small-context copy of it does, on both paths.
TEST_F(GenerateTest, AHugeContextCostsOnlyWhatTheRequestReaches) {
  model::ModelConfig c = small_config(tokenizer_->vocab_size());
  auto small = make_model(c);
  c.max_position_embeddings = model::ModelConfig::kMaxPositions;
  auto huge = make_model(c);
  TextGenerator a(*small, *tokenizer_), b(*huge, *tokenizer_);
  const GenerateOptions o = greedy(10);
  const std::vector<std::string> prompts{"the cat sat", "a dog ran on the mat and"};
  const auto want = a.generate(prompts, o), got = b.generate(prompts, o);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  huge->prepare_inference(model::Precision::BF16);  // the fast path's tables are bounded too
  small->prepare_inference(model::Precision::BF16);
  EXPECT_EQ(b.generate(prompts[0], o).tokens, a.generate(prompts[0], o).tokens);
}

// Issue 13, defect 16: an empty prompt starts from BOS (here, with no BOS, from EOS) instead of
// being refused; the token-level entry still refuses an empty id list.
TEST_F(GenerateTest, AnEmptyPromptStartsFromBos) {
  auto d = make_model();
  TextGenerator gen(*d, *tokenizer_);
  const std::optional<TokenId> start = tokenizer_->bos_id() ? tokenizer_->bos_id() : tokenizer_->eos_id();
  ASSERT_TRUE(start.has_value());
  const GenerationResult r = gen.generate("", greedy(5));
  EXPECT_EQ(r.prompt_tokens, 1);
  EXPECT_EQ(r.tokens, gen.generate_ids({{*start}}, greedy(5)).front().tokens);
  EXPECT_THROW(gen.generate_ids({{}}, greedy(5)), ValueError);
}

}  // namespace
}  // namespace corelm::infer
