// The official openai Python client (tests/requirements.txt pins it) against a live `corelm serve`:
// this driver saves a small random model with a real chat template (tests/data/chat_templates:
// SmolLM2's ChatML for the full run, Llama 3.1's for the chat checks), then runs
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
#include <iterator>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/generate_fixtures.h"
#include "common/model_factories.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/tokenizer_train.h"

namespace fs = std::filesystem;
using namespace corelm;

namespace {

// The stand-in when tests/data/chat_templates is absent: ChatML written for this test.
constexpr const char* kChatMl =
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{%- endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

std::string template_file(const std::string& name) {
  std::ifstream f(std::string(CORELM_SOURCE_DIR) + "/tests/data/chat_templates/" + name, std::ios::binary);
  if (!f) return {};
  return std::string(std::istreambuf_iterator<char>(f), {});
}

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
    // The markers of both templates, so the rendered prompts hold real special tokens.
    bpe.special_tokens = {"<|endoftext|>",     "<|im_start|>",      "<|im_end|>",
                          "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    train_bpe({(dir_ / "corpus.txt").string()}, bpe, (dir_ / "tokenizer.json").string());
    fs::remove(dir_ / "corpus.txt");
    auto tok = Tokenizer::load((dir_ / "tokenizer.json").string());
    // Init range 0.1: real margins for greedy, still a spread for temperature 1.
    model::ModelConfig c = corelm::testing::tiny_decoder_config(static_cast<int64_t>(tok->vocab_size()), 0.1);
    c.max_position_embeddings = 256;  // room for the chat prompts and 160 constrained tokens
    model::Decoder d(c);
    d.init_weights(2024);
    model::save_model_dir(dir_.string(), d);
  }
  // tokenizer_config.json with this chat template and BOS/EOS texts (bos "" -> null).
  void write_template(const std::string& tmpl, const std::string& bos, const std::string& eos) {
    nlohmann::json cfg = {{"chat_template", tmpl}, {"eos_token", eos}};
    cfg["bos_token"] = bos.empty() ? nlohmann::json() : nlohmann::json(bos);
    std::ofstream(dir_ / "tokenizer_config.json") << cfg.dump(1) << "\n";
  }
  // Runs the script (bounded at 80 s; the runner's 110 s limit is the backstop) and checks it
  // reported SUMMARY OK.
  void run_checks(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{script_, "--corelm", corelm::testing::corelm_path(), "--model", dir_.string(),
                                  "--timeout", "80"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = corelm::testing::run_program(python_, args, corelm::testing::CliOptions{110});
    std::cout << r.out << (r.err.empty() ? "" : "\nstderr:\n" + r.err.substr(0, 4000)) << std::endl;
    EXPECT_FALSE(r.timed_out) << "the openai-client script ran past 110 s";
    EXPECT_EQ(r.rc, 0) << "some openai-client checks failed (FAIL lines above)";
    EXPECT_NE(r.out.find("SUMMARY OK"), std::string::npos);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  std::string python_, script_;
  fs::path dir_;
};

// Every check, with SmolLM2's template (ChatML with a default system turn).
TEST_F(OpenAIClientTest, OfficialClientAgainstLiveServer) {
  std::string tmpl = template_file("HuggingFaceTB-SmolLM2-Instruct.jinja");
  if (tmpl.empty()) tmpl = kChatMl;
  write_template(tmpl, "", "<|im_end|>");
  run_checks();
}

// The chat checks with Llama 3.1's template: bos_token written by the template, set/trim/slicing,
// header markers as special tokens.
TEST_F(OpenAIClientTest, ChatWithLlama31Template) {
  const std::string tmpl = template_file("meta-llama-Llama-3.1-8B-Instruct.jinja");
  if (tmpl.empty()) GTEST_SKIP() << "tests/data/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja is absent";
  write_template(tmpl, "<|begin_of_text|>", "<|eot_id|>");
  run_checks({"--only", "chat_template,chat_streaming,chat_logprobs,stop_strings"});
}

}  // namespace
