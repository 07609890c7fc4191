// GGUF against the two reference implementations:
// - llama.cpp itself (llama-cpp-python, tests/requirements-llamacpp.txt): a `tiny`-shaped corelm
//   model with our trained byte-level BPE tokenizer is written as GGUF F32 by save_model, loaded in
//   llama.cpp (tests/oracle/llamacpp_crosscheck.py), and greedy generation from fixed prompt ids must
//   give exactly corelm's tokens; the logits of every position are compared (max_rel <= 1e-3).
//   Skips when llama_cpp is not importable.
// - the `gguf` PyPI package as the writer (tests/oracle/gguf_model_oracle.py): its random llama
//   loads through load_model and the logits equal transformers' on the same weights.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "common/tensor_factories.h"
#include "corelm/generate.h"
#include "corelm/model_loader.h"
#include "corelm/tokenizer_train.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

namespace fs = std::filesystem;

std::string python() {
  const std::string p = CORELM_TEST_PYTHON;
  return fs::exists(p) ? p : "/usr/bin/python3";
}

TEST(GgufPackageModel, LoadsAndMatchesTransformers) {
  const Fixture& fx = load_fixture("gguf_model_oracle.py", "gguf_model.json");
  CORELM_REQUIRE_FIXTURE(fx);
  for (const auto& c : fx.data->at("cases")) {
    model::LoadOptions o;
    o.require_tokenizer = false;
    model::Checkpoint ck = model::load_model(c.at("gguf").get<std::string>(), o);
    const auto ids = c.at("ids").get<std::vector<int64_t>>();
    const std::vector<float> ours =
        ck.model.decoder.forward(Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())})).to_float_vector();
    const ErrorStats e = ErrorStats::between(ours, c.at("logits").get<std::vector<float>>());
    const std::string name = c.at("name").get<std::string>();
    std::printf("ORACLE gguf-package model=%s max_abs=%s max_rel=%s\n", name.c_str(), format_error(e.max_abs).c_str(),
                format_error(e.max_rel).c_str());
    EXPECT_LE(e.max_rel, 1e-4) << name;
  }
}

struct Scratch {
  fs::path dir = fs::path(CORELM_BINARY_DIR) / "oracle" / ("llamacpp." + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { fs::remove_all(dir); }
};

// The `tiny` preset's shape with our BPE tokenizer, weights random but far from uniform (std 0.08,
// norms around 1) so that greedy choices are clear-cut and every tensor matters.
model::Checkpoint tiny_with_tokenizer(const Scratch& s) {
  std::string corpus;
  for (int i = 0; i < 300; ++i)
    corpus += "Once upon a time, a little fox named Pip found " + std::to_string(i) + " shiny stones by the river.\n";
  std::ofstream(s.dir / "corpus.txt") << corpus;
  BpeTrainOptions to;
  to.vocab_size = 512;
  train_bpe({(s.dir / "corpus.txt").string()}, to, (s.dir / "tokenizer.json").string());

  model::ModelConfig config = model::ModelConfig::preset("tiny");
  model::Decoder d(config);
  uint64_t seed = 100;
  for (const auto& [name, p] : d.named_parameters()) {
    std::vector<float> v = testing::random_tensor(p.shape(), seed++, 0.08f).to_float_vector();
    if (name.ends_with("norm.weight"))
      for (float& x : v) x = 1.0f + 2.5f * x;
    d.load_parameter(name, Tensor::from_vector(v, p.shape()));
  }
  model::Checkpoint ck{model::LoadedModel{std::move(d), nullptr}, "model-dir", {}, -1, {}, {}};
  model::save_model(ck, (s.dir / "tiny").string(), {"corelm", "f32", 0, {}});
  fs::copy_file(s.dir / "tokenizer.json", s.dir / "tiny" / "tokenizer.json");
  return model::load_model((s.dir / "tiny").string());
}

TEST(SlowLlamaCpp, GreedyTokensAndLogitsMatchCorelm) {
  if (std::system((python() + " -c 'import llama_cpp' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "llama_cpp not importable by " << python()
                 << ": pip install -r tests/requirements-llamacpp.txt into .venv (builds llama.cpp from source)";
  Scratch s;
  model::Checkpoint ck = tiny_with_tokenizer(s);
  const std::string gguf = (s.dir / "tiny.gguf").string();
  model::SaveSummary summary = model::save_model(ck, gguf, {});
  ASSERT_TRUE(summary.tokenizer_written);

  const std::vector<TokenId> prompt = ck.model.tokenizer->encode("Once upon a time, a little fox");
  const int64_t n_new = 24;
  infer::GenerateOptions o;
  o.max_new_tokens = n_new;
  o.sampling.greedy = true;
  o.stop_at_eos = false;
  const auto ours = infer::TextGenerator(ck.model.decoder, *ck.model.tokenizer).generate_ids({prompt}, o).at(0).tokens;
  ASSERT_EQ(static_cast<int64_t>(ours.size()), n_new);

  std::string ids;
  for (TokenId t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const fs::path out = s.dir / "llamacpp.json";
  const std::string cmd = python() + " " + CORELM_SOURCE_DIR + "/tests/oracle/llamacpp_crosscheck.py " + gguf + " " +
                          ids + " " + std::to_string(n_new) + " " + std::to_string(ck.model.tokenizer->vocab_size()) + " " +
                          out.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json r = json::parse(std::ifstream(out));
  const auto theirs = r.at("generated").get<std::vector<TokenId>>();
  EXPECT_EQ(theirs, ours) << "llama.cpp's greedy tokens differ from corelm's";

  // Logits of every position of prompt + generated tokens, ours from one full forward.
  std::vector<int64_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), ours.begin(), ours.end());
  const int64_t T = static_cast<int64_t>(all.size());
  ASSERT_EQ(r.at("positions").get<int64_t>(), T);
  const std::vector<float> mine = ck.model.decoder.forward(Tensor::from_vector(all, {1, T})).to_float_vector();
  const ErrorStats e = ErrorStats::between(mine, r.at("logits").get<std::vector<float>>());
  std::printf("ORACLE llama.cpp (llama-cpp-python %s) tiny f32: %lld prompt + %lld greedy tokens equal=%d, logits "
              "max_abs=%s max_rel=%s\n",
              r.at("llama_cpp_python").get<std::string>().c_str(), static_cast<long long>(prompt.size()),
              static_cast<long long>(n_new), theirs == ours, format_error(e.max_abs).c_str(),
              format_error(e.max_rel).c_str());
  EXPECT_LE(e.max_rel, 1e-4);  // measured 2.8e-6 with an f32 KV cache
}

}  // namespace
}  // namespace corelm::oracle
