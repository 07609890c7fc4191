// The official openai Python client (tests/requirements.txt pins it) against a live `corelm serve`:
// this driver saves a small random model with a ChatML chat template, then runs
// tests/serve/test_openai_client.py, which starts the real binary on 127.0.0.1 with --port 0, runs
// its checks (completions, streaming, chat with the model's template, logprobs, n=2, stop strings,
// seeds, json_schema / json_object, usage counts, error classes) and kills the server. Each check
// prints PASS/FAIL; the test passes when the script reports SUMMARY OK. It skips when the .venv or
// the openai / httpx / jinja2 packages are missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_runner.h"
#include "common/generate_fixtures.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/tokenizer_train.h"

namespace fs = std::filesystem;
using namespace corelm;

namespace {

// ChatML as SmolLM2 / Qwen use it, written for this test: a default system turn when the
// conversation has none, each turn trimmed, the assistant header when asked for.
constexpr const char* kChatTemplate =
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{%- endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

class OpenAIClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = CORELM_TEST_PYTHON;
    script_ = std::string(CORELM_SOURCE_DIR) + "/tests/serve/test_openai_client.py";
    if (!fs::exists(python_)) GTEST_SKIP() << "no Python venv at " << python_ << " (scripts/setup creates it)";
    const auto probe = corelm::testing::run_program(
        python_, {"-c", "import openai, httpx, jinja2; print(openai.__version__)"}, corelm::testing::CliOptions{30});
    if (probe.rc != 0)
      GTEST_SKIP() << "the openai client is not installed in " << python_
                   << " (pip install -r tests/requirements.txt): " << probe.err.substr(0, 300);
    dir_ = fs::temp_directory_path() / ("corelm_openai_client_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string text = corelm::testing::pseudo_text(
        {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home", "red", "blue", "{", "}",
         "\"", ":", "true", "false", "1", "2"},
        0x5EED5EEDull, 3000, 9);
    std::ofstream(dir_ / "corpus.txt", std::ios::binary) << text;
    BpeTrainOptions bpe;
    bpe.vocab_size = 360;
    bpe.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    train_bpe({(dir_ / "corpus.txt").string()}, bpe, (dir_ / "tokenizer.json").string());
    fs::remove(dir_ / "corpus.txt");
    auto tok = Tokenizer::load((dir_ / "tokenizer.json").string());
    model::ModelConfig c;
    c.vocab_size = static_cast<int64_t>(tok->vocab_size());
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 256;  // room for the chat prompts and 160 constrained tokens
    c.tie_word_embeddings = true;
    c.initializer_range = 0.1;  // real margins for greedy, still a spread for temperature 1
    model::Decoder d(c);
    d.init_weights(2024);
    model::save_model_dir(dir_.string(), d);
    nlohmann::json cfg = {{"chat_template", kChatTemplate}, {"bos_token", nullptr}, {"eos_token", "<|im_end|>"}};
    std::ofstream(dir_ / "tokenizer_config.json") << cfg.dump(1) << "\n";
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  std::string python_, script_;
  fs::path dir_;
};

TEST_F(OpenAIClientTest, OfficialClientAgainstLiveServer) {
  // The script bounds itself at 80 s (and kills its server); the runner's limit is the backstop.
  const auto r = corelm::testing::run_program(
      python_, {script_, "--corelm", corelm::testing::corelm_path(), "--model", dir_.string(), "--timeout", "80"},
      corelm::testing::CliOptions{110});
  std::cout << r.out << (r.err.empty() ? "" : "\nstderr:\n" + r.err.substr(0, 4000)) << std::endl;
  EXPECT_FALSE(r.timed_out) << "the openai-client script ran past 110 s";
  EXPECT_EQ(r.rc, 0) << "some openai-client checks failed (FAIL lines above)";
  EXPECT_NE(r.out.find("SUMMARY OK"), std::string::npos);
}

}  // namespace
