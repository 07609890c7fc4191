// Generation stops on ANY end-of-sequence id: a checkpoint whose generation_config.json lists
// several eos ids (as chat models do) must stop on the second as well as on the first, through
// the same path `corelm generate` takes (load_model -> Checkpoint::eos_ids -> GenerateOptions).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/model_loader.h"
#include "corelm/tokenizer.h"
#include "common/generate_fixtures.h"
#include "common/model_factories.h"

namespace corelm::infer {
namespace {

namespace fs = std::filesystem;

std::string training_text() {
  return testing::pseudo_text({"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"},
                              0x9E3779B97F4A7C15ull, 1500, 9);
}

// A saved model directory (config.json, model.safetensors, tokenizer.json) in a fresh temp dir.
class GenerateEosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_eos_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    tokenizer_ = testing::train_small_bpe(dir_, training_text(), 280);
    // 0.2: well separated logits, no near-ties in the greedy runs.
    model::Decoder decoder(testing::tiny_decoder_config(static_cast<int64_t>(tokenizer_->vocab_size()), 0.2));
    decoder.init_weights(77);
    model::save_model_dir(dir_.string(), decoder);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_generation_config(const std::string& eos_json) {
    std::ofstream(dir_ / "generation_config.json") << "{\"eos_token_id\": " << eos_json << "}\n";
  }
  // Stops at eos unless a test says otherwise, as `corelm generate` does.
  static GenerateOptions greedy(int64_t n) { return testing::greedy_options(n, /*stop_at_eos=*/true); }

  fs::path dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

constexpr int64_t kSteps = 20;

TEST_F(GenerateEosTest, StopsOnTheSecondEosIdOfGenerationConfig) {
  const std::vector<TokenId> prompt = tokenizer_->encode("the cat sat");
  // The run without any eos, from the saved model: it picks which ids serve as eos below. The
  // checkpoint's own eos (the tokenizer's <|endoftext|>) must not occur in it.
  model::Checkpoint plain = model::load_model(dir_.string());
  TextGenerator plain_gen(plain.model.decoder, *plain.model.tokenizer);
  GenerateOptions no_eos = greedy(kSteps);
  no_eos.stop_at_eos = false;
  const GenerationResult full = plain_gen.generate_ids({prompt}, no_eos).front();
  ASSERT_EQ(full.tokens.size(), size_t(kSteps));
  auto occurs = [&](int64_t id) { return std::find(full.tokens.begin(), full.tokens.end(), id) != full.tokens.end(); };
  for (int64_t id : plain.eos_ids) ASSERT_FALSE(occurs(id)) << "the greedy run already emits eos id " << id;

  // First eos: an id the model never produces here. Second: the token the run produces at step 6.
  const TokenId second = full.tokens[6];
  const size_t stop_at = std::find(full.tokens.begin(), full.tokens.end(), second) - full.tokens.begin();
  TokenId never = 0;
  while (occurs(never)) ++never;
  write_generation_config("[" + std::to_string(never) + ", " + std::to_string(second) + "]");

  model::Checkpoint ck = model::load_model(dir_.string());
  ASSERT_EQ(ck.eos_ids, (std::vector<int64_t>{never, second}));
  EXPECT_EQ(ck.model.decoder.config().eos_token_id, never) << "config.json has none: the first listed id";
  TextGenerator gen(ck.model.decoder, *ck.model.tokenizer);

  // Only the tokenizer's and the config's eos (the behaviour before eos lists): the second id does not stop the run.
  EXPECT_EQ(gen.generate_ids({prompt}, greedy(kSteps)).front().tokens.size(), size_t(kSteps));

  // What `corelm generate` passes: every listed id.
  GenerateOptions o = greedy(kSteps);
  for (int64_t id : ck.eos_ids) o.eos_ids.push_back(static_cast<TokenId>(id));
  const GenerationResult r = gen.generate_ids({prompt}, o).front();
  EXPECT_EQ(r.finish_reason, "stop");
  ASSERT_EQ(r.tokens.size(), stop_at + 1);
  EXPECT_EQ(r.tokens.back(), second);
  EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), full.tokens.begin()));

  // In a batch the row stops at the same token whatever its neighbour does.
  const std::vector<TokenId> other = tokenizer_->encode("a dog ran home");
  const auto batch = gen.generate_ids({other, prompt}, o);
  EXPECT_EQ(batch[1].tokens, r.tokens);

  // --ignore-eos: no id stops the run, listed or not.
  o.stop_at_eos = false;
  EXPECT_EQ(gen.generate_ids({prompt}, o).front().tokens.size(), size_t(kSteps));
}

TEST_F(GenerateEosTest, EosIdOutsideTheVocabularyIsAClearError) {
  model::Checkpoint ck = model::load_model(dir_.string());
  TextGenerator gen(ck.model.decoder, *tokenizer_);
  GenerateOptions o = greedy(4);
  o.eos_ids = {static_cast<TokenId>(ck.model.decoder.config().vocab_size)};
  try {
    gen.generate_ids({tokenizer_->encode("the cat")}, o);
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("eos id"), std::string::npos) << e.what();
  }
  o.eos_ids = {-1};
  EXPECT_THROW(gen.generate_ids({tokenizer_->encode("the cat")}, o), ValueError);
}

}  // namespace
}  // namespace corelm::infer
