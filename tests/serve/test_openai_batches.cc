// The official openai client against the Files + Batches API of a live `corelm serve
// --state-dir`: this driver saves a small random model (with a ChatML template, for the chat
// batch) and runs tests/serve/test_openai_batches.py, which uploads, creates, polls and
// downloads batches and compares every output body with the direct request's (see the script's
// docstring). It skips when the .venv or the openai / httpx packages are missing, or when the
// binary has no --state-dir (a build without the queue-backed server).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

constexpr const char* kChatMl =
    "{%- for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

}  // namespace

TEST(OpenAIBatches, OfficialClientFilesAndBatchesAgainstLiveServer) {
  const std::string python = CORELM_TEST_PYTHON;
  if (!fs::exists(python)) GTEST_SKIP() << "no Python venv at " << python << " (scripts/setup creates it)";
  const auto probe = corelm::testing::run_program(python, {"-c", "import openai, httpx; print(openai.__version__)"},
                                                  corelm::testing::CliOptions{30});
  if (probe.rc != 0)
    GTEST_SKIP() << "the openai client is not installed in " << python << ": " << probe.err.substr(0, 300);
  const auto help = corelm::testing::run_corelm({"serve", "--help"}, corelm::testing::CliOptions{30});
  if ((help.out + help.err).find("--state-dir") == std::string::npos)
    GTEST_SKIP() << "this corelm serve has no --state-dir (the queue-backed server is not built in)";

  const fs::path dir = fs::temp_directory_path() / ("corelm_openai_batches_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string text = corelm::testing::pseudo_text(
      {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "hello", "1", "2", "3"}, 0xBA7C4ull, 2000, 9);
  std::ofstream(dir / "corpus.txt", std::ios::binary) << text;
  BpeTrainOptions bpe;
  bpe.vocab_size = 320;
  bpe.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  train_bpe({(dir / "corpus.txt").string()}, bpe, (dir / "tokenizer.json").string());
  fs::remove(dir / "corpus.txt");
  auto tok = Tokenizer::load((dir / "tokenizer.json").string());
  model::ModelConfig c = corelm::testing::tiny_decoder_config(static_cast<int64_t>(tok->vocab_size()), 0.1);
  c.max_position_embeddings = 128;
  model::Decoder d(c);
  d.init_weights(77);
  model::save_model_dir(dir.string(), d);
  nlohmann::json cfg = {{"chat_template", kChatMl}, {"eos_token", "<|im_end|>"}, {"bos_token", nullptr}};
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1) << "\n";

  const auto r = corelm::testing::run_program(
      python,
      {std::string(CORELM_SOURCE_DIR) + "/tests/serve/test_openai_batches.py", "--corelm",
       corelm::testing::corelm_path(), "--model", dir.string(), "--timeout", "80", "--requests", "40"},
      corelm::testing::CliOptions{110});
  std::cout << r.out << (r.err.empty() ? "" : "\nstderr:\n" + r.err.substr(0, 4000)) << std::endl;
  EXPECT_FALSE(r.timed_out) << "the openai-batches script ran past 110 s";
  EXPECT_EQ(r.rc, 0) << "some checks failed (FAIL lines above)";
  EXPECT_NE(r.out.find("SUMMARY OK"), std::string::npos);
  std::error_code ec;
  fs::remove_all(dir, ec);
}
