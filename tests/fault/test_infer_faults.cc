// Issue 13, the inference and tool defects: memory that a request does not need (the KV cache of
// a full context), out-of-memory that aborted, token ids that wrapped, a temperature that
// overflowed, a tokenizer writer with a fixed temp name, and CLI values that failed unclearly.
// Most run the real binary (tests/common/cli_runner.h), under RLIMIT_AS where memory matters.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/process_limits.h"
#include "common/cli_runner.h"
#include "common/generate_fixtures.h"
#include "common/model_factories.h"
#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/out_of_memory.h"
#include "corelm/token_ids.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"

namespace fs = std::filesystem;
using corelm::testing::CliOptions;
using corelm::testing::CliResult;
using corelm::testing::run_corelm;
using corelm::testing::ScratchDir;

namespace corelm {
namespace {

std::string corpus_text() {
  return testing::pseudo_text({"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"},
                              0x51ED2701ull, 1200, 9);
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A model directory: a small trained BPE and a 2-layer decoder (GQA, 2 kv heads x 16 dims) whose
// context is `context` positions. RoPE has no learned positions, so the weights are the same
// few hundred KB whatever the context.
void make_model_dir(const fs::path& dir, int64_t context) {
  fs::create_directories(dir);
  auto tok = testing::train_small_bpe(dir, corpus_text(), 300);
  model::ModelConfig c = testing::tiny_decoder_config(static_cast<int64_t>(tok->vocab_size()), 0.2);
  c.max_position_embeddings = context;
  model::Decoder d(c);
  d.init_weights(5);
  model::save_model_dir(dir.string(), d);
}

std::string prompt_file(const fs::path& dir, int n) {
  std::string text;
  for (int i = 0; i < n; ++i) text += "the cat sat on the mat " + std::to_string(i) + "\n";
  const std::string path = (dir / "prompts.txt").string();
  std::ofstream(path) << text;
  return path;
}

using corelm::testing::kAddressSanitizer;

using corelm::testing::vm_size;

// Neither an abort, a signal nor an uncaught exception: the CLI's own error line.
void expect_clear_failure(const CliResult& r, const std::string& needle) {
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

// ---------------------------------------------------------------- defect 8: KV cache sizing

// 16 prompts of a 65,536-context model: the cache used to be 16 x 65,536 positions x 2 layers x
// 2 x 2 kv heads x 16 dims x 4 bytes = 512 MiB whatever -n said; prompt + 4 tokens is a few KB.
TEST(InferFaults, GenerateSizesTheKvCacheByPromptAndMaxNewTokens) {
  ScratchDir d("infer_kv_ctx");
  make_model_dir(d.path() / "m", 65536);
  CliOptions opt;
  opt.timeout_s = 60;
  if (!kAddressSanitizer) opt.as_limit = long{320} << 20;  // the old cache alone was 512 MiB
  for (const char* precision : {"bf16", "f32"}) {
    const CliResult r = run_corelm({"generate", "--model", d / "m", "--prompt-file", prompt_file(d.path(), 16), "-n", "4",
                                    "--greedy", "--ignore-eos", "--precision", precision},
                                   opt);
    EXPECT_EQ(r.rc, 0) << precision << ": " << r.err;
    EXPECT_NE(r.out.find("[15] "), std::string::npos) << r.out;
  }
}

// A context of 2^31-1 used to end in "internal error: std::bad_alloc". Such a config is now
// refused by name (config sizes are bounded, defect 6); the largest context allowed is only a
// bound on what a request may reach, not memory taken up front.
TEST(InferFaults, GenerateRunsWithAHugeContext) {
  ScratchDir d("infer_kv_huge");
  make_model_dir(d.path() / "too_big", 64);
  {
    const std::string cfg = d / "too_big/config.json";
    std::ifstream in(cfg);
    nlohmann::json j = nlohmann::json::parse(in);
    j["max_position_embeddings"] = (int64_t{1} << 31) - 1;
    std::ofstream(cfg) << j.dump(1);
  }
  const CliResult refused = run_corelm({"generate", "--model", d / "too_big", "--prompt", "the cat", "-n", "2"});
  EXPECT_EQ(refused.rc, 1) << refused.err;
  EXPECT_NE(refused.err.find("max_position_embeddings"), std::string::npos) << refused.err;
  make_model_dir(d.path() / "m", model::ModelConfig::kMaxPositions);
  CliOptions opt;
  opt.timeout_s = 60;
  if (!kAddressSanitizer) opt.as_limit = long{320} << 20;
  const CliResult r = run_corelm({"generate", "--model", d / "m", "--prompt", "the cat", "-n", "5", "--greedy",
                                  "--ignore-eos", "--precision", "f32"},
                                 opt);
  EXPECT_EQ(r.rc, 0) << r.err;
  // The fast path (bf16, the default) also had a RoPE table of 2^31 positions.
  const CliResult fast = run_corelm({"generate", "--model", d / "m", "--prompt", "the cat", "-n", "5", "--greedy",
                                     "--ignore-eos"},
                                    opt);
  EXPECT_EQ(fast.rc, 0) << fast.err;
}

// A request that really needs more than there is says how much, instead of aborting.
TEST(InferFaults, AKvCacheThatCannotFitSaysHowMuchItNeeds) {
  if (kAddressSanitizer) GTEST_SKIP() << "RLIMIT_AS does not work under AddressSanitizer";
  ScratchDir d("infer_kv_oom");
  make_model_dir(d.path() / "m", 1 << 20);
  CliOptions opt;
  opt.timeout_s = 60;
  opt.as_limit = long{512} << 20;  // 16 x 2^20 positions x ... = 8 GiB of cache
  const CliResult r = run_corelm({"generate", "--model", d / "m", "--prompt-file", prompt_file(d.path(), 16), "-n",
                                  "100000000", "--precision", "f32"},
                                 opt);
  expect_clear_failure(r, "out of memory allocating 8589934592 bytes (8192.0 MiB) for a KV cache of 16 rows x 1048576 positions");
  EXPECT_NE(r.err.find("needs 8192.0 MiB of KV cache"), std::string::npos) << r.err;
}

// ---------------------------------------------------------------- defect 7: out of memory

// In the library: an allocation too large for the limit, in a child, is an OutOfMemoryError that
// names the purpose, and the unwinding that follows (every tensor of a half-built KV cache
// released with the heap exhausted) finishes instead of aborting.
TEST(InferFaults, OutOfMemoryInTheLibraryIsAnErrorAndUnwindsCleanly) {
  if (kAddressSanitizer) GTEST_SKIP() << "RLIMIT_AS does not work under AddressSanitizer";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const rlim_t limit = vm_size() + (rlim_t{256} << 20);
    rlimit r{limit, limit};
    ::setrlimit(RLIMIT_AS, &r);
    model::ModelConfig c = testing::tiny_decoder_config(300, 0.02);
    c.max_position_embeddings = 1 << 22;
    int rc = 1;
    try {
      model::KVCache cache(c, 8, 1 << 22);  // 8 x 4M positions x 2 layers: 8 GiB
    } catch (const OutOfMemoryError& e) {
      rc = std::string(e.what()).find("for a KV cache of 8 rows x 4194304 positions x 2 layers") == std::string::npos ? 2 : 0;
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << WTERMSIG(st);
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: no error; 2: message; 3: another exception";
}

// Against the binary: a std::bad_alloc outside the tensor allocator (here the std::string that
// holds stdin) was "internal error: std::bad_alloc", exit 2.
TEST(InferFaults, OutOfMemoryInTheBinaryIsAClearLine) {
  if (kAddressSanitizer) GTEST_SKIP() << "RLIMIT_AS does not work under AddressSanitizer";
  ScratchDir d("infer_oom_cli");
  auto tok = testing::train_small_bpe(d.path(), corpus_text(), 280);
  CliOptions opt;
  opt.timeout_s = 60;
  opt.as_limit = long{160} << 20;
  opt.stdin_data.assign(size_t{256} << 20, 'a');
  const CliResult r = run_corelm({"tokenize", "--tokenizer", d / "tokenizer.json", "--threads", "1"}, opt);
  expect_clear_failure(r, "corelm: error: out of memory");
}

// ---------------------------------------------------------------- defect 12: token ids

TEST(InferFaults, TokenIdsOutOfRangeOrNotIntegersAreErrorsNamingThePosition) {
  EXPECT_EQ(parse_token_ids("[72, 5]", "stdin", 300), (std::vector<TokenId>{72, 5}));
  EXPECT_EQ(parse_token_ids(" 72\n5 ", "stdin", 300), (std::vector<TokenId>{72, 5}));
  EXPECT_TRUE(parse_token_ids("  \n", "stdin", 300).empty());
  auto message = [](const std::string& text, size_t vocab) {
    try {
      parse_token_ids(text, "stdin", vocab);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message("[72, 4294967368]", 300), "stdin: position 1: token id 4294967368 is outside the vocabulary [0, 300)");
  EXPECT_EQ(message("[72, 1.5]", 300), "stdin: position 1: 1.5 is not a token id (ids are non-negative integers)");
  EXPECT_EQ(message("[18446744073709551615]", 300),
            "stdin: position 0: token id 18446744073709551615 is outside the vocabulary [0, 300)");
  EXPECT_EQ(message("[3, -1]", 300), "stdin: position 1: token id -1 is outside the vocabulary [0, 300)");
  EXPECT_EQ(message("[\"7\"]", 300), "stdin: position 0: \"7\" is not a token id (ids are non-negative integers)");
  EXPECT_EQ(message("[300]", 300), "stdin: position 0: token id 300 is outside the vocabulary [0, 300)");
  EXPECT_EQ(message("[1, 2", 300).rfind("stdin: expected a JSON array of token ids: ", 0), 0u);
  EXPECT_EQ(message("72 4294967368", 300), "stdin: position 1: token id 4294967368 is outside the vocabulary [0, 300)");
  EXPECT_EQ(message("72 1.5", 300), "stdin: position 1: '1.5' is not a token id (ids are non-negative integers)");
  EXPECT_EQ(message("1 2 99999999999999999999999", 300),
            "stdin: position 2: token id 99999999999999999999999 is outside the vocabulary [0, 300)");
  EXPECT_EQ(message("-5", 0), "stdin: position 0: token id -5 is outside the id range [0, 2147483648)");
  EXPECT_EQ(message("+5", 300), "stdin: position 0: '+5' is not a token id (ids are non-negative integers)");
  const std::vector<uint32_t> file_ids{1, 2, 0x80000005u};
  EXPECT_THROW(check_token_ids(file_ids, "ids.bin", 0), ValueError);
}

TEST(InferFaults, DetokenizeRefusesWrappedIdsAndRoundTripsGoodOnes) {
  ScratchDir d("infer_detok");
  auto tok = testing::train_small_bpe(d.path(), corpus_text(), 300);
  const std::string tj = d / "tokenizer.json";
  nlohmann::json ids = tok->encode("Hi there");
  CliOptions opt;
  opt.timeout_s = 30;
  opt.stdin_data = ids.dump();
  CliResult r = run_corelm({"detokenize", "--tokenizer", tj}, opt);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "Hi there");
  // The reproduction: 4294967368 = 2^32 + 72 used to print "HH".
  for (const auto& [input, needle] : std::vector<std::pair<std::string, std::string>>{
           {"[72, 4294967368]", "position 1: token id 4294967368 is outside"},
           {"[1.5]", "position 0: 1.5 is not a token id"},
           {"18446744073709551615", "position 0: token id 18446744073709551615 is outside"}}) {
    opt.stdin_data = input;
    r = run_corelm({"detokenize", "--tokenizer", tj}, opt);
    expect_clear_failure(r, needle);
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  opt.stdin_data = "[1, 2]\n[3, 4294967296]\n";
  r = run_corelm({"detokenize", "--tokenizer", tj, "--jsonl"}, opt);
  expect_clear_failure(r, "stdin line 2: position 1: token id 4294967296 is outside");
  // A uint32 token file holding 2^31 + 5 wrapped to a negative id.
  const std::string bin = d / "ids.bin";
  const uint32_t raw[3] = {5, 6, 0x80000005u};
  std::ofstream(bin, std::ios::binary).write(reinterpret_cast<const char*>(raw), sizeof raw);
  opt.stdin_data.clear();
  r = run_corelm({"detokenize", "--tokenizer", tj, "--input", bin, "--dtype", "uint32"}, opt);
  expect_clear_failure(r, "ids.bin: position 2: token id 2147483653 is outside the vocabulary");
}

// ---------------------------------------------------------------- defect 13: temperature

TEST(InferFaults, ATinyTemperatureIsGreedy) {
  ScratchDir d("infer_temp");
  make_model_dir(d.path() / "m", 256);
  CliOptions opt;
  opt.timeout_s = 60;
  const CliResult greedy =
      run_corelm({"generate", "--model", d / "m", "--prompt", "the cat", "-n", "12", "--ignore-eos", "--greedy", "--json"}, opt);
  ASSERT_EQ(greedy.rc, 0) << greedy.err;
  for (const char* t : {"1e-38", "1e-20", "0"}) {
    const CliResult r = run_corelm(
        {"generate", "--model", d / "m", "--prompt", "the cat", "-n", "12", "--ignore-eos", "--temperature", t, "--json"}, opt);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"], nlohmann::json::parse(greedy.out)["tokens"]) << "temperature " << t;
  }
  for (const char* bad : {"-0.5", "nan"}) {
    const CliResult r = run_corelm({"generate", "--model", d / "m", "--prompt", "x", "--temperature", bad}, opt);
    expect_clear_failure(r, "temperature");
  }
  const CliResult p = run_corelm({"generate", "--model", d / "m", "--prompt", "x", "--top-p", "1.5"}, opt);
  expect_clear_failure(p, "top_p must be in (0, 1]");
}

// ---------------------------------------------------------------- defect 16: prompt and threads

TEST(InferFaults, AnEmptyPromptGeneratesFromBos) {
  ScratchDir d("infer_empty_prompt");
  make_model_dir(d.path() / "m", 256);
  CliOptions opt;
  opt.timeout_s = 60;
  for (const char* special : {"", "--no-special"}) {
    std::vector<std::string> args{"generate", "--model", d / "m", "--prompt", "", "-n", "6", "--greedy", "--ignore-eos",
                                  "--json"};
    if (*special) args.push_back(special);
    const CliResult r = run_corelm(args, opt);
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"].size(), 6u) << r.out;
    EXPECT_EQ(j["prompt_tokens"], 1) << r.out;
  }
  const CliResult neither = run_corelm({"generate", "--model", d / "m"}, opt);
  expect_clear_failure(neither, "give exactly one of --prompt and --prompt-file");
}

TEST(InferFaults, ThreadCountsAreValidated) {
  ScratchDir d("infer_threads");
  make_model_dir(d.path() / "m", 256);
  CliOptions opt;
  opt.timeout_s = 60;
  CliResult r = run_corelm({"generate", "--model", d / "m", "--prompt", "x", "--threads", "100000"}, opt);
  expect_clear_failure(r, "--threads must be in [1, 1024] (got 100000)");
  r = run_corelm({"tokenize", "--tokenizer", d / "m/tokenizer.json", "--threads", "100000"}, opt);
  expect_clear_failure(r, "--threads must be in [0, 1024]");
  r = run_corelm({"tokenize", "--tokenizer", d / "m/tokenizer.json", "--threads", "-2"}, opt);
  expect_clear_failure(r, "--threads must be in [0, 1024]");
}

// ---------------------------------------------------------------- defect 14: tokenizer train output

TEST(InferFaults, TokenizerTrainIntoAFolderLeavesNothingBehind) {
  ScratchDir d("infer_tok_out");
  std::ofstream(d / "corpus.txt") << corpus_text();
  fs::create_directories(d.path() / "out");
  const std::vector<std::string> before = entries(d.path());
  CliOptions opt;
  opt.timeout_s = 60;
  CliResult r = run_corelm({"tokenizer", "train", "--vocab-size", "280", "--input", d / "corpus.txt", "--output",
                            d / "out", "--no-progress"},
                           opt);
  expect_clear_failure(r, "is a directory");
  EXPECT_EQ(entries(d.path()), before) << "no out.tmp (or any other name) beside the folder";
  EXPECT_TRUE(fs::is_empty(d.path() / "out"));
  r = run_corelm({"tokenizer", "train", "--vocab-size", "280", "--input", d / "corpus.txt", "--output",
                  d / "missing/tokenizer.json", "--no-progress"},
                 opt);
  expect_clear_failure(r, "does not exist");
  EXPECT_EQ(entries(d.path()), before);
}

// Disk full while writing: the previous tokenizer.json stays whole and no temp file is left.
TEST(InferFaults, TokenizerTrainOnAFullDiskKeepsTheOldFile) {
  ScratchDir d("infer_tok_full");
  std::ofstream(d / "corpus.txt") << corpus_text();
  std::ofstream(d / "tokenizer.json") << "{\"old\": true}\n";
  const std::vector<std::string> before = entries(d.path());
  CliOptions opt;
  opt.timeout_s = 60;
  opt.fsize_limit = 4096;  // the new tokenizer.json is larger; the corpus is only read
  const CliResult r = run_corelm({"tokenizer", "train", "--vocab-size", "300", "--input", d / "corpus.txt", "--output",
                                  d / "tokenizer.json", "--no-progress"},
                                 opt);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(slurp(d / "tokenizer.json"), "{\"old\": true}\n");
  EXPECT_EQ(entries(d.path()), before);
}

// Concurrent writers of one output used to share "<output>.tmp": one's rename took the other's
// half-written file, the other's rename failed. Each now writes its own temp file.
TEST(InferFaults, ConcurrentTokenizerTrainingsToOneFileAllSucceed) {
  ScratchDir d("infer_tok_conc");
  std::ofstream(d / "corpus.txt") << corpus_text();
  const std::string out = d / "tokenizer.json";
  constexpr int kWriters = 8;
  std::vector<std::string> errors(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i)
    threads.emplace_back([&, i] {
      try {
        BpeTrainOptions o;
        o.vocab_size = 300;
        train_bpe({d / "corpus.txt"}, o, out);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWriters; ++i) EXPECT_EQ(errors[i], "") << "writer " << i;
  EXPECT_NO_THROW(Tokenizer::load(out));
  EXPECT_EQ(entries(d.path()), (std::vector<std::string>{"corpus.txt", "tokenizer.json"}));
}

}  // namespace
}  // namespace corelm
