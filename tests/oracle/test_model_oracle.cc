// corelm's Decoder against Hugging Face transformers (LlamaForCausalLM / Qwen2ForCausalLM):
// tests/oracle/hf_model.py saves seeded models with save_pretrained (HF config.json + the
// safetensors package's model.safetensors) and records the logits, the loss of one training step
// and every parameter's gradient. Here the same folder is loaded through ModelConfig::load and
// SafetensorsFile, the same step runs through our ops and autograd, and everything is compared.
// Errors: max_abs and max_rel = max_abs / max|reference| (per tensor; the worst tensor reported),
// printed as `ORACLE model=...` lines and collected in CORELM_BINARY_DIR/oracle/model_errors.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "corelm/model.h"
#include "corelm/ops.h"
#include "corelm/safetensors.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

constexpr double kLogitsTol = 3e-5;  // max_rel, f32 (measured <= 3.1e-6 with the reference kernels)
constexpr double kGradTol = 1e-4;    // max_rel per parameter, f32 (measured <= 7.2e-6)

const std::vector<std::string>& case_names() {
  static const std::vector<std::string> names = {"llama", "qwen2", "llama_bias", "mistral"};
  return names;
}

const json* find_case(const json& data, const std::string& name) {
  for (const auto& c : data.at("cases"))
    if (c.at("name") == name) return &c;
  return nullptr;
}

class ModelOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelOracle, LogitsAndGradientsMatchTransformers) {
  const Fixture& fx = load_fixture("hf_model.py", "model_oracle.json");
  if (fx.skip) GTEST_SKIP() << "transformers oracle unavailable (needs torch + transformers: scripts/setup --test): "
                            << fx.message;
  ASSERT_TRUE(fx.data.has_value()) << fx.message;
  const std::string name = GetParam();
  const json* c = find_case(*fx.data, name);
  ASSERT_NE(c, nullptr) << "case " << name << " missing from the fixture";
  const std::string folder = c->at("folder").get<std::string>();

  // Load exactly as a user would: HF's config.json and HF's safetensors file.
  model::ModelConfig config = model::ModelConfig::load(folder + "/config.json");
  model::Decoder decoder(config);
  auto weights = io::SafetensorsFile::open(folder + "/model.safetensors");
  std::set<std::string> loaded;
  for (const auto& n : weights.names()) {
    ASSERT_TRUE(decoder.has_parameter(n)) << "HF tensor " << n << " has no corelm parameter";
    decoder.load_parameter(n, weights.get(n));
    loaded.insert(n);
  }
  for (const auto& [n, t] : decoder.named_parameters()) EXPECT_TRUE(loaded.count(n)) << n << " not in the HF file";
  EXPECT_EQ(c->at("parameters").get<std::vector<std::string>>().size(), decoder.named_parameters().size());

  std::vector<int64_t> flat;
  for (const auto& row : c->at("ids"))
    for (const auto& id : row) flat.push_back(id.get<int64_t>());
  const int64_t B = static_cast<int64_t>(c->at("ids").size()), T = static_cast<int64_t>(flat.size()) / B;
  const Tensor ids = Tensor::from_vector(flat, {B, T});

  decoder.set_requires_grad(true);
  Tensor logits = decoder.forward(ids);
  const int64_t V = config.vocab_size;
  Tensor loss = ops::cross_entropy(ops::reshape(ops::slice(logits, 1, 0, T - 1), {B * (T - 1), V}),
                                   ids.slice(1, 1, T).contiguous().reshape({B * (T - 1)}));
  loss.backward();

  auto results = io::SafetensorsFile::open(folder + "/results.safetensors");
  const ErrorStats logit_err =
      ErrorStats::between(logits.to_float_vector(), results.get("logits").to_float_vector());
  const double ref_loss = results.get("loss").to_float_vector()[0];
  const double loss_err = std::fabs(loss.item() - ref_loss);
  ErrorStats grad_err;
  std::string worst_name;
  for (const auto& [n, p] : decoder.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    ErrorStats e = ErrorStats::between(p.grad().to_float_vector(), results.get("grad." + n).to_float_vector());
    if (e.max_rel >= grad_err.max_rel) worst_name = n;
    grad_err.merge(e);
    EXPECT_LE(e.max_rel, kGradTol) << "gradient of " << n << " (max_abs " << e.max_abs << ")";
  }

  std::printf("ORACLE model=%s logits max_abs=%s max_rel=%s grads max_abs=%s max_rel=%s loss_abs_diff=%s worst_grad=%s\n",
              name.c_str(), format_error(logit_err.max_abs).c_str(), format_error(logit_err.max_rel).c_str(),
              format_error(grad_err.max_abs).c_str(), format_error(grad_err.max_rel).c_str(),
              format_error(loss_err).c_str(), worst_name.c_str());
  std::fflush(stdout);
  write_table_row("model_errors.md",
                  "Decoder vs transformers " + fx.data->at("transformers").get<std::string>() + " (torch " +
                      fx.data->at("torch").get<std::string>() +
                      "), f32, eager attention; max_rel = max_abs / max|reference| per tensor, worst tensor shown.\n\n"
                      "| case | shape | logits max_abs | logits max_rel | loss abs diff | grads max_abs | grads max_rel | "
                      "worst grad |\n|---|---|---|---|---|---|---|---|\n",
                  case_names(), name,
                  "| " + name + " | " + c->at("architecture").get<std::string>() + " V=" + std::to_string(V) +
                      " H=" + std::to_string(config.hidden_size) + " L=" + std::to_string(config.num_hidden_layers) +
                      " heads=" + std::to_string(config.num_attention_heads) + "/" +
                      std::to_string(config.num_key_value_heads) + (config.tie_word_embeddings ? " tied" : " untied") +
                      (config.attention_bias ? " bias" : "") + ", B=" + std::to_string(B) + " T=" + std::to_string(T) +
                      " | " + format_error(logit_err.max_abs) + " | " + format_error(logit_err.max_rel) + " | " +
                      format_error(loss_err) + " | " + format_error(grad_err.max_abs) + " | " +
                      format_error(grad_err.max_rel) + " | `" + worst_name + "` |");

  EXPECT_LE(logit_err.max_rel, kLogitsTol);
  EXPECT_LE(loss_err, 1e-5 * std::max(1.0, std::fabs(ref_loss)));
}

INSTANTIATE_TEST_SUITE_P(Transformers, ModelOracle, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace corelm::oracle
