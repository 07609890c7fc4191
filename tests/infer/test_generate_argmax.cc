// Greedy generation takes the decoder's fused LM-head argmax for its decode steps; its tokens must
// be exactly those of the plain loop (Logits::Last, then argmax over the tokenizer's ids) on every
// inference precision, batched, with a model vocabulary padded past the tokenizer's, and with a
// repetition penalty (which keeps the full-logits path) still applied.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "corelm/autograd.h"
#include "corelm/generate.h"
#include "corelm/model.h"
#include "corelm/tokenizer.h"
#include "common/generate_fixtures.h"
#include "common/model_factories.h"

namespace corelm::infer {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> small_tokenizer() {
  const fs::path dir = fs::temp_directory_path() / ("corelm_argmax_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string text = testing::pseudo_text(
      {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "home"}, 88172645463325252ull, 2000, 9);
  auto tok = testing::train_small_bpe(dir, text, 300);
  fs::remove_all(dir);
  return tok;
}

model::ModelConfig config(int64_t vocab) { return testing::tiny_decoder_config(vocab, 0.2); }

// The old decode path, one prompt alone: Logits::Last every step, argmax over [0, allowed).
std::vector<TokenId> plain_greedy(const model::Decoder& d, const std::vector<TokenId>& prompt, int64_t n,
                                  int64_t allowed) {
  autograd::NoGradGuard no_grad;
  model::KVCache cache(d.config(), 1, d.config().max_position_embeddings);
  std::vector<TokenId> out;
  Tensor ids = Tensor::from_vector(prompt, {1, static_cast<int64_t>(prompt.size())});
  for (int64_t s = 0; s < n; ++s) {
    Tensor logits = d.forward_cached(ids, cache, {0}, model::Logits::Last).contiguous();
    const TokenId next = argmax(std::span<const float>(logits.data<float>(), static_cast<size_t>(allowed)));
    out.push_back(next);
    ids = Tensor::from_vector(std::vector<TokenId>{next}, {1, 1});
  }
  return out;
}

class GenerateArgmax : public ::testing::TestWithParam<model::Precision> {
 protected:
  static void SetUpTestSuite() { tokenizer_ = small_tokenizer().release(); }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* GenerateArgmax::tokenizer_ = nullptr;

GenerateOptions greedy(int64_t n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  return o;
}

TEST_P(GenerateArgmax, GreedyTokensEqualThePlainLoop) {
  const int64_t tok_vocab = static_cast<int64_t>(tokenizer_->vocab_size());
  // Exactly the tokenizer's vocabulary, and one padded past it over several LM-head blocks (the
  // padded ids must never be chosen).
  for (int64_t vocab : {tok_vocab, int64_t{4500}}) {
    model::Decoder d(config(vocab));
    d.init_weights(17);
    d.prepare_inference(GetParam());
    TextGenerator gen(d, *tokenizer_);
    const std::vector<std::string> prompts{"the cat sat", "a dog", "the mat and the dog ran far", "home"};
    std::vector<std::vector<TokenId>> ids;
    for (const auto& p : prompts) ids.push_back(tokenizer_->encode(p));
    const auto results = gen.generate_ids(ids, greedy(20));
    ASSERT_EQ(results.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<TokenId> expected = plain_greedy(d, ids[i], 20, tok_vocab);
      EXPECT_EQ(results[i].tokens, expected) << "prompt " << i << " vocab " << vocab;
      for (TokenId t : results[i].tokens) EXPECT_LT(t, tok_vocab);
    }
  }
}

TEST_P(GenerateArgmax, RepetitionPenaltyStillApplies) {
  model::Decoder d(config(static_cast<int64_t>(tokenizer_->vocab_size())));
  d.init_weights(18);
  d.prepare_inference(GetParam());
  TextGenerator gen(d, *tokenizer_);
  GenerateOptions plain = greedy(24), penalised = greedy(24);
  penalised.sampling.repetition_penalty = 100.0f;
  const auto a = gen.generate("the cat", plain), b = gen.generate("the cat", penalised);
  // A strong penalty on a random model changes some choice within 24 tokens (else the penalty was
  // skipped along with the logits).
  EXPECT_NE(a.tokens, b.tokens);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GenerateArgmax,
                         ::testing::Values(model::Precision::F32, model::Precision::BF16, model::Precision::Int8),
                         [](const auto& info) { return std::string(model::precision_name(info.param)); });

}  // namespace
}  // namespace corelm::infer
