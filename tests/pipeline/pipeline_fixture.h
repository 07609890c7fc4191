// Shared set-up for the pipeline tests: a tiny random decoder with a byte-level BPE tokenizer
// trained in the test, saved as a model directory; a JSONL corpus; helpers to read an output
// directory back; the real `corelm` binary runs as a child process through common/cli_runner.h.
#pragma once
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/pipeline.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"

namespace corelm::testing {
namespace fs = std::filesystem;

inline void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// Deterministic pseudo-text: words from a small vocabulary, n words.
inline std::string words(std::mt19937& rng, int n) {
  static const char* vocab[] = {"the",   "cat",  "sat",   "on",    "a",      "mat",    "dog",   "ran",
                                "fast",  "blue", "river", "stone", "market", "prices", "rose",  "team",
                                "won",   "game", "new",   "chip",  "faster", "storm",  "hit",   "coast",
                                "music", "film", "star",  "bank",  "rates",  "fell",   "quiet", "night"};
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += vocab[rng() % (sizeof(vocab) / sizeof(vocab[0]))];
  }
  return s;
}

// The corpus: {"id": "r<i>", "text": ...}, lengths from 1 to ~max_words words.
inline std::string corpus_jsonl(int records, int max_words, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out;
  for (int i = 0; i < records; ++i) {
    nlohmann::json j{{"id", "r" + std::to_string(i)}, {"text", words(rng, 1 + static_cast<int>(rng() % max_words))}};
    out += j.dump() + "\n";
  }
  return out;
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("corelm_pipeline_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    model_ = (root_ / "model").string();
    fs::create_directories(model_);
    std::mt19937 rng(7);
    std::string text;
    for (int i = 0; i < 400; ++i) text += words(rng, 12) + "\nLabel: sports\nAnswer: yes no\n";
    write_text(root_ / "tok_corpus.txt", text);
    BpeTrainOptions bpe;
    bpe.vocab_size = 320;
    train_bpe({(root_ / "tok_corpus.txt").string()}, bpe, model_ + "/tokenizer.json");
    auto tok = Tokenizer::load(model_ + "/tokenizer.json");
    model::ModelConfig c;
    c.vocab_size = static_cast<int64_t>(tok->vocab_size());
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 16;
    c.max_position_embeddings = 96;
    model::Decoder d(c);
    d.init_weights(11);
    model::save_model_dir(model_, d);
  }
  void TearDown() override {
    for (const auto& m : mounts_) std::system(("umount " + m + " 2>/dev/null").c_str());
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::string path(const std::string& name) const { return (root_ / name).string(); }

  pipeline::RunOptions classify_options(const std::string& input, const std::string& out) const {
    pipeline::RunOptions o;
    o.model = model_;
    o.inputs = {input};
    o.out = out;
    o.task.kind = pipeline::TaskKind::Classify;
    o.task.labels = {"sports", "business", "world", "sci"};
    o.chunk_records = 16;
    return o;
  }

  fs::path root_;
  std::string model_;
  std::vector<std::string> mounts_;  // unmounted in TearDown, even after a failed assertion
};

// All part files of an output directory concatenated in name order (the run's final output).
inline std::string read_parts(const std::string& dir, const std::string& stem = "part-") {
  std::vector<fs::path> parts;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with(stem) && n.ends_with(".jsonl")) parts.push_back(e.path());
  }
  std::sort(parts.begin(), parts.end());
  std::string all;
  for (const auto& p : parts) all += slurp(p);
  return all;
}

inline std::vector<nlohmann::json> parse_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace corelm::testing
