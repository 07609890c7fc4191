// The hybrid through the command line as a corelm_hybrid GGUF (docs/INTEROP.md): `corelm convert`
// writes it (f32 and q8_0), `corelm inspect` shows the architecture and the layer kinds, and
// `corelm generate` on the GGUF gives the folder's greedy text (f32) or runs (q8_0).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_runner.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "serve/serve_fixture.h"

namespace corelm {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::run_corelm;

class CliGgufHybrid : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(testing::corelm_path())) GTEST_SKIP() << testing::corelm_path() << " not built";
    dir_ = fs::temp_directory_path() / ("corelm_cli_ggufh_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    testing::make_model_dir(dir_ / "tiny");
    // The tiny folder's shape as a hybrid: linear, sliding (window 3), full, linear.
    model::ModelConfig c = model::ModelConfig::load((dir_ / "tiny" / "config.json").string());
    c.num_hidden_layers = 4;
    const model::LayerSpec lin{model::AttentionKind::Linear, 0, 16, model::FfnKind::Dense};
    c.layers = {lin, model::LayerSpec{model::AttentionKind::Sliding, 3, 0, model::FfnKind::Dense},
                model::LayerSpec{}, lin};
    model::Decoder d(c);
    d.init_weights(21);
    fs::create_directories(dir_ / "hyb");
    fs::copy_file(dir_ / "tiny" / "tokenizer.json", dir_ / "hyb" / "tokenizer.json");
    model::save_model_dir((dir_ / "hyb").string(), d);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& n) const { return (dir_ / n).string(); }
  fs::path dir_;
};

std::string greedy(const std::string& model) {
  CliResult r = run_corelm({"generate", "--model", model, "--prompt", "the cat and the dog went to the old house",
                            "-n", "12", "--greedy", "--ignore-eos"});
  EXPECT_EQ(r.rc, 0) << r.all();
  return r.out;
}

TEST_F(CliGgufHybrid, ConvertInspectGenerate) {
  CliResult r = run_corelm({"convert", p("hyb"), p("h.gguf"), "--json"});
  ASSERT_EQ(r.rc, 0) << r.all();
  r = run_corelm({"convert", p("hyb"), p("q8.gguf"), "--dtype", "q8_0"});
  ASSERT_EQ(r.rc, 0) << r.all();

  r = run_corelm({"inspect", p("h.gguf")});
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_NE(r.out.find("general.architecture = \"corelm_hybrid\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer types: linear_attention (state 16), sliding_attention (window 3), full_attention, "
                       "linear_attention (state 16)"),
            std::string::npos)
      << r.out;
  r = run_corelm({"inspect", p("h.gguf"), "--json"});
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["layer_types"].size(), 4u);
  EXPECT_EQ(j["config"]["model_type"], "corelm_hybrid");

  // The GGUF carries the vocabulary and gives the folder's text exactly (f32 weights).
  const std::string folder = greedy(p("hyb"));
  EXPECT_FALSE(folder.empty());
  EXPECT_EQ(greedy(p("h.gguf")), folder);
  EXPECT_FALSE(greedy(p("q8.gguf")).empty());
  // And back to a folder: the same config.json layer kinds.
  r = run_corelm({"convert", p("h.gguf"), p("back")});
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_EQ(model::ModelConfig::load(p("back/config.json")).layers,
            model::ModelConfig::load(p("hyb/config.json")).layers);
  EXPECT_EQ(greedy(p("back")), folder);
}

// The reference tooling: the gguf package parses the file and sees corelm's keys; llama.cpp
// (llama-cpp-python) refuses the unknown architecture instead of running it.
TEST_F(CliGgufHybrid, LlamaCppRefusesTheFile) {
  const std::string python = CORELM_TEST_PYTHON;
  if (!fs::exists(python)) GTEST_SKIP() << python << " absent";
  CliResult r = run_corelm({"convert", p("hyb"), p("h.gguf")});
  ASSERT_EQ(r.rc, 0) << r.all();
  const std::string script = std::string(CORELM_SOURCE_DIR) + "/tests/oracle/llamacpp_refuses_hybrid.py";
  r = testing::run_program(python, {script, p("h.gguf")});
  if (r.rc != 0 && r.err.find("No module named 'gguf'") != std::string::npos) GTEST_SKIP() << "gguf not importable";
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_EQ(j["architecture"], "corelm_hybrid");
  EXPECT_EQ(j["layer_types"], nlohmann::json({"linear_attention", "sliding_attention", "full_attention",
                                               "linear_attention"}));
  const auto& ts = j["tensors"];
  EXPECT_NE(std::find(ts.begin(), ts.end(), "blk.0.attn_decay"), ts.end());
  EXPECT_NE(std::find(ts.begin(), ts.end(), "blk.3.attn_out_norm.weight"), ts.end());
  if (j["refused"].is_null()) GTEST_SKIP() << "llama_cpp not importable";
  EXPECT_EQ(j["refused"], true) << r.all();
  EXPECT_NE(r.err.find("unknown model architecture: 'corelm_hybrid'"), std::string::npos) << r.err;
  std::printf("llama-cpp-python: %s; llama.cpp log: unknown model architecture: 'corelm_hybrid'\n",
              j.value("error", std::string()).c_str());
}

}  // namespace
}  // namespace corelm
