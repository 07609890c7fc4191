// corelm's hybrid decoder against the PyTorch hybrid of bench/hybrid_torch.py (written from
// docs/HYBRID.md, not from corelm's code; tests/oracle/torch_hybrid_model.py runs it): a tiny
// config with every layer kind (linear, sliding with a window shorter than the sequence, full),
// random weights, norms and decays written as config.json + model.safetensors; logits of a batch
// and the gradient of the mean next-token cross-entropy of every parameter, with and without
// bos_isolation. Bounds: logits 1e-5, gradients 1e-4 (max_abs / max |torch|). Printed as
// `ORACLE hybrid ...` lines.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/cli_runner.h"
#include "corelm/model.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/safetensors.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

model::ModelConfig hybrid_config(bool bos_isolation) {
  using model::AttentionKind;
  using model::LayerSpec;
  model::ModelConfig c;
  c.vocab_size = 41;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 5;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.initializer_range = 0.2;
  c.bos_token_id = 1;
  c.bos_isolation = bos_isolation;
  c.rms_norm_eps = 1e-5;
  c.layers = {LayerSpec{AttentionKind::Linear, 0, 6, model::FfnKind::Dense},
              LayerSpec{AttentionKind::Sliding, 5, 0, model::FfnKind::Dense}, LayerSpec{},
              LayerSpec{AttentionKind::Linear, 0, 6, model::FfnKind::Dense},
              LayerSpec{AttentionKind::Sliding, 5, 0, model::FfnKind::Dense}};
  return c;
}

void run_case(bool bos_isolation) {
  const model::ModelConfig c = hybrid_config(bos_isolation);
  model::Decoder m(c);
  m.init_weights(3);
  Generator g(4);
  for (const auto& [name, t] : m.named_parameters()) {
    if (name.find("norm") != std::string::npos) m.load_parameter(name, ops::add_scalar(Tensor::randn(t.shape(), g, 0.3f), 1.0f));
    if (name.find("decay") != std::string::npos) m.load_parameter(name, ops::add(t, Tensor::randn(t.shape(), g, 0.5f)));
  }
  const int64_t B = 2, T = 19, V = c.vocab_size;
  std::vector<int64_t> ids(static_cast<size_t>(B * T));
  for (auto& id : ids) id = 2 + static_cast<int64_t>(g.below(static_cast<uint64_t>(V - 2)));
  ids[0] = 1;
  ids[6] = 1;        // row 0: documents at 0 and 6
  ids[T + 11] = 1;   // row 1: a second document from 11
  const std::filesystem::path dir =
      std::filesystem::path(CORELM_BINARY_DIR) / "oracle" / (bos_isolation ? "hybrid_model_iso" : "hybrid_model");
  std::filesystem::create_directories(dir);
  c.save((dir / "config.json").string());
  io::save_safetensors((dir / "model.safetensors").string(), m.named_parameters());
  {
    json j = json::array();
    for (int64_t b = 0; b < B; ++b) j.push_back(std::vector<int64_t>(ids.begin() + b * T, ids.begin() + (b + 1) * T));
    std::ofstream(dir / "ids.json") << j.dump();
  }
  std::filesystem::remove(dir / "torch.json");
  testing::CliOptions o;
  o.timeout_s = 120;
  const testing::CliResult r = testing::run_program(
      CORELM_TEST_PYTHON, {std::string(CORELM_SOURCE_DIR) + "/tests/oracle/torch_hybrid_model.py", dir.string()}, o);
  if (r.rc == 77) GTEST_SKIP() << "no torch: " << r.err;
  ASSERT_EQ(r.rc, 0) << r.all();
  std::ifstream in(dir / "torch.json");
  const json ref = json::parse(in);

  m.set_requires_grad(true);
  const Tensor id_t = Tensor::from_vector(ids, {B, T});
  const Tensor logits = m.forward(id_t);
  const Tensor targets = id_t.slice(1, 1, T).contiguous().reshape({B * (T - 1)});
  ops::cross_entropy(ops::reshape(ops::slice(logits, 1, 0, T - 1), {B * (T - 1), V}), targets).backward();
  const ErrorStats fwd = ErrorStats::between(logits.to_float_vector(), tensor_from_json(ref.at("logits")).to_float_vector());
  EXPECT_LE(fwd.max_rel, 1e-5);
  ErrorStats worst;
  std::string worst_name;
  for (const auto& [name, t] : m.named_parameters()) {
    ASSERT_TRUE(ref.at("grads").contains(name)) << "torch has no parameter " << name;
    const ErrorStats e = ErrorStats::between(t.grad().to_float_vector(), tensor_from_json(ref.at("grads").at(name)).to_float_vector());
    EXPECT_LE(e.max_rel, 1e-4) << name;
    if (e.max_rel >= worst.max_rel) worst_name = name;
    worst.merge(e);
  }
  EXPECT_EQ(ref.at("grads").size(), m.named_parameters().size());
  std::printf("ORACLE hybrid%s logits max_abs=%s max_rel=%s; gradients (%zu tensors) max_abs=%s max_rel=%s (worst %s)\n",
              bos_isolation ? " bos_isolation" : "", format_error(fwd.max_abs).c_str(), format_error(fwd.max_rel).c_str(),
              m.named_parameters().size(), format_error(worst.max_abs).c_str(), format_error(worst.max_rel).c_str(),
              worst_name.c_str());
}

TEST(HybridModelOracle, LogitsAndGradientsMatchTorch) { run_case(false); }
TEST(HybridModelOracle, LogitsAndGradientsMatchTorchWithBosIsolation) { run_case(true); }

}  // namespace
}  // namespace corelm::oracle
