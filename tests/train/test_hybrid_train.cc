// `corelm train --preset hybrid` (issue 17): a few AdamW steps of the hybrid decoder with the full
// and the sampled softmax loss on a small text; the checkpoint's config.json names the corelm
// hybrid architecture, the model directory loads back with the same layer kinds and
// `corelm generate` runs it on the f32 and bf16 paths.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "common/cli_runner.h"
#include "corelm/model.h"

namespace corelm {
namespace {

using testing::CliOptions;
using testing::CliResult;
using testing::run_program;
using testing::ScratchDir;

TEST(HybridTrainCli, FewStepsWithFullAndSampledLoss) {
  ASSERT_TRUE(std::filesystem::exists(testing::corelm_path())) << "build the corelm binary (target corelm_cli)";
  ScratchDir dir("hybrid_train");
  std::mt19937 rng(3);
  const std::vector<std::string> words = {"the", "cat", "sat", "on", "mat", "dog", "ran", "far", "and", "home"};
  std::string corpus;
  for (int line = 0; line < 300; ++line)
    for (int w = 0; w < 10; ++w) corpus += words[rng() % words.size()] + (w == 9 ? "\n" : " ");
  std::ofstream(dir / "corpus.txt") << corpus;
  for (const std::string loss : {"full", "sampled"}) {
    SCOPED_TRACE(loss);
    const std::string out = dir / ("out_" + loss);
    std::vector<std::string> args = {"train", "--preset", "hybrid", "--data", dir / "corpus.txt", "--out", out,
                                     "--steps", "3", "--batch", "2", "--seq", "32", "--threads", "1",
                                     "--eval-batches", "1", "--sample-tokens", "0", "--seed", "5", "--no-progress",
                                     "--loss", loss};
    if (loss == "sampled") args.insert(args.end(), {"--negatives", "16"});
    CliOptions o;
    o.timeout_s = 120;
    const CliResult r = run_program("", args, o);
    ASSERT_EQ(r.rc, 0) << r.all();
    const nlohmann::json summary = nlohmann::json::parse(r.out);
    std::printf("hybrid train --loss %s: %s\n", loss.c_str(), summary.dump().c_str());
    const model::ModelConfig c = model::ModelConfig::load(out + "/config.json");
    EXPECT_EQ(c.layers, model::ModelConfig::preset("hybrid").layers);
    std::ifstream in(out + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["model_type"], "corelm_hybrid");
    // The trained directory generates on the reference (f32) and the packed (bf16) path, greedy
    // (temperature 0): the same tokens on both for these few steps of a barely trained model.
    std::string texts[2];
    for (int i = 0; i < 2; ++i) {
      const CliResult g = run_program("", {"generate", "--model", out, "--prompt", "the cat", "--max-new-tokens", "6",
                                           "--temperature", "0", "--precision", i == 0 ? "f32" : "bf16"}, o);
      ASSERT_EQ(g.rc, 0) << g.all();
      texts[i] = g.out;
    }
    std::printf("hybrid generate f32: '%s' bf16: '%s'\n", texts[0].c_str(), texts[1].c_str());
    // Prompts of different lengths in one batch: rings and states cannot forget padding, so the
    // generator prefills each length on its own; a prompt's text is the one it gets alone.
    std::ofstream(dir / "prompts.txt") << "the cat\nsat on the mat and\n";
    const CliResult batch = run_program("", {"generate", "--model", out, "--prompt-file", dir / "prompts.txt",
                                             "--max-new-tokens", "6", "--temperature", "0"}, o);
    ASSERT_EQ(batch.rc, 0) << batch.all();
    EXPECT_NE(batch.out.find(texts[1]), std::string::npos) << batch.out;
  }
}

// `corelm run` over a hybrid: prompts run at their exact length (rings and states cannot forget
// padding) and without shared-prefix reuse, so every record's result is the one it gets alone
// whatever the batch, and classify's label rows start clean after a longer batch.
TEST(HybridRunCli, ScoreAndClassifyGiveEachRecordItsSoloResultAtAnyBatch) {
  ASSERT_TRUE(std::filesystem::exists(testing::corelm_path())) << "build the corelm binary (target corelm_cli)";
  ScratchDir dir("hybrid_run");
  std::mt19937 rng(7);
  const std::vector<std::string> words = {"the", "cat", "sat", "on", "mat", "dog", "ran", "far", "and", "home"};
  std::string corpus, jsonl;
  for (int line = 0; line < 300; ++line)
    for (int w = 0; w < 10; ++w) corpus += words[rng() % words.size()] + (w == 9 ? "\n" : " ");
  for (int i = 0; i < 12; ++i) {
    std::string text;
    for (int w = 0; w < 2 + (i * 5) % 17; ++w) text += (w ? " " : "") + words[rng() % words.size()];
    jsonl += nlohmann::json{{"id", i}, {"text", text}}.dump() + "\n";
  }
  std::ofstream(dir / "corpus.txt") << corpus;
  std::ofstream(dir / "in.jsonl") << jsonl;
  CliOptions o;
  o.timeout_s = 120;
  const std::string model = dir / "m";
  const CliResult t = run_program("", {"train", "--preset", "hybrid", "--data", dir / "corpus.txt", "--out", model,
                                       "--steps", "3", "--batch", "2", "--seq", "32", "--eval-batches", "0",
                                       "--sample-tokens", "0", "--no-progress"}, o);
  ASSERT_EQ(t.rc, 0) << t.all();
  auto results = [&](const std::string& task, const std::string& batch, const std::string& precision) {
    const std::string out = dir / ("out_" + task + batch + precision);
    std::vector<std::string> args = {"run", task, "--model", model, "--input", dir / "in.jsonl", "--out", out,
                                     "--batch", batch, "--precision", precision, "--id-field", "id"};
    if (task == "classify") args.insert(args.end(), {"--labels", "cat,dog,home"});
    const CliResult r = run_program("", args, o);
    EXPECT_EQ(r.rc, 0) << r.all();
    std::map<std::string, std::string> by_id;
    for (const auto& e : std::filesystem::directory_iterator(out))
      if (e.path().filename().string().rfind("part-", 0) == 0) {
        std::ifstream in(e.path());
        for (std::string line; std::getline(in, line);) {
          nlohmann::json j = nlohmann::json::parse(line);
          by_id[j["id"].dump()] = j.dump();
        }
      }
    return by_id;
  };
  for (const std::string task : {"score", "classify"})
    for (const std::string precision : {"f32", "bf16"}) {
      SCOPED_TRACE(task + " " + precision);
      const auto solo = results(task, "1", precision), batched = results(task, "5", precision);
      EXPECT_EQ(solo.size(), 12u);
      EXPECT_EQ(solo, batched);
    }
}

}  // namespace
}  // namespace corelm
