// Hugging Face folders through corelm's one loader: tests/oracle/hf_checkpoint.py saves seeded
// Qwen2 (QKV bias) and Llama (GQA, tied and untied, one in bf16) models with
// save_pretrained(max_shard_size="200KB") -- shards + model.safetensors.index.json +
// generation_config.json -- and records transformers' own logits for fixed ids. load_model(folder)
// must reproduce them (f32: max_rel <= 1e-4; the bf16 checkpoint: same bound against transformers
// computing in f32 from those bf16 weights, and bf16 tolerance against transformers computing in
// bf16). Strict mode must reject a folder with a tensor removed / added, listing the names.
// Errors go to CORELM_BINARY_DIR/oracle/hf_checkpoint_errors.md and `ORACLE hf_checkpoint` lines.
#include <gtest/gtest.h>

#include <cstdio>

#include "corelm/error.h"
#include "corelm/model_loader.h"
#include "corelm/safetensors.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

constexpr double kF32Tol = 1e-4;        // max_rel, f32 compute on the same weights
constexpr double kBf16ComputeTol = 5e-2;  // max_rel against transformers computing in bf16

const std::vector<std::string>& case_names() {
  static const std::vector<std::string> n = {"qwen2_bias", "llama_gqa_tied", "llama_gqa_untied", "llama_bf16"};
  return n;
}

class HfCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(HfCheckpoint, LoadModelMatchesTransformersLogits) {
  const Fixture& fx = load_fixture("hf_checkpoint.py", "hf_checkpoint.json");
  CORELM_REQUIRE_FIXTURE(fx);
  const json* c = nullptr;
  for (const auto& e : fx.data->at("cases"))
    if (e.at("name") == GetParam()) c = &e;
  ASSERT_NE(c, nullptr) << GetParam() << " missing from the fixture";
  EXPECT_GT(c->at("shards").get<int>(), 1) << "the fixture should be sharded";

  model::LoadOptions o;
  o.require_tokenizer = false;  // save_pretrained of a bare model writes no tokenizer
  model::Checkpoint ck = model::load_model(c->at("folder").get<std::string>(), o);
  EXPECT_EQ(ck.format, "model-dir");
  if (GetParam() == "qwen2_bias") {
    EXPECT_EQ(ck.eos_ids, (std::vector<int64_t>{2, 3})) << "generation_config.json lists two eos ids";
    EXPECT_TRUE(ck.model.decoder.config().attention_bias);
  }

  std::vector<int64_t> flat;
  for (const auto& row : c->at("ids"))
    for (const auto& id : row) flat.push_back(id.get<int64_t>());
  const int64_t B = static_cast<int64_t>(c->at("ids").size());
  const Tensor ids = Tensor::from_vector(flat, {B, static_cast<int64_t>(flat.size()) / B});
  const std::vector<float> ours = ck.model.decoder.forward(ids).to_float_vector();

  auto ref = io::SafetensorsFile::open(c->at("logits").get<std::string>());
  const ErrorStats f32 = ErrorStats::between(ours, ref.get("logits").to(DType::F32).to_float_vector());
  std::string row = "| " + GetParam() + " | " + c->at("dtype").get<std::string>() + " | " +
                    std::to_string(c->at("shards").get<int>()) + " | " + format_error(f32.max_abs) + " | " +
                    format_error(f32.max_rel) + " |";
  std::printf("ORACLE hf_checkpoint=%s f32-compute max_abs=%s max_rel=%s\n", GetParam().c_str(),
              format_error(f32.max_abs).c_str(), format_error(f32.max_rel).c_str());
  EXPECT_LE(f32.max_rel, kF32Tol);
  if (ref.contains("logits_bf16_compute")) {
    const ErrorStats bf = ErrorStats::between(ours, ref.get("logits_bf16_compute").to(DType::F32).to_float_vector());
    std::printf("ORACLE hf_checkpoint=%s vs-transformers-bf16-compute max_abs=%s max_rel=%s\n", GetParam().c_str(),
                format_error(bf.max_abs).c_str(), format_error(bf.max_rel).c_str());
    row += " " + format_error(bf.max_rel) + " |";
    EXPECT_LE(bf.max_rel, kBf16ComputeTol);
  } else {
    row += " - |";
  }
  write_table_row("hf_checkpoint_errors.md",
                  "| case | weights | shards | max_abs (f32 compute) | max_rel | max_rel vs HF bf16 compute |\n"
                  "|---|---|---|---|---|---|",
                  case_names(), GetParam(), row);
}

INSTANTIATE_TEST_SUITE_P(Cases, HfCheckpoint, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

TEST(HfCheckpointStrict, MissingAndExtraTensorsAreListed) {
  const Fixture& fx = load_fixture("hf_checkpoint.py", "hf_checkpoint.json");
  CORELM_REQUIRE_FIXTURE(fx);
  model::LoadOptions o;
  o.require_tokenizer = false;
  auto message = [&](const std::string& folder) -> std::string {
    try {
      model::load_model(folder, o);
    } catch (const FormatError& e) {
      return e.what();
    }
    return "";
  };
  const std::string missing = message(fx.data->at("missing").get<std::string>());
  EXPECT_NE(missing.find("missing tensors: model.layers.1.mlp.up_proj.weight"), std::string::npos) << missing;
  const std::string extra = message(fx.data->at("extra").get<std::string>());
  EXPECT_NE(extra.find("unexpected: model.layers.0.mlp.extra_proj.weight"), std::string::npos) << extra;

  // Non-strict: both load, with a warning naming the tensor.
  o.strict = false;
  for (const char* key : {"missing", "extra"}) {
    model::Checkpoint ck = model::load_model(fx.data->at(key).get<std::string>(), o);
    ASSERT_FALSE(ck.warnings.empty()) << key;
    EXPECT_NE(ck.warnings.front().find(key == std::string("missing") ? "up_proj" : "extra_proj"), std::string::npos)
        << ck.warnings.front();
  }
}

}  // namespace
}  // namespace corelm::oracle
