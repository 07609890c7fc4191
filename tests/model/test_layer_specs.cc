// Per-layer specs in ModelConfig (issue 17): HF's layer_types / sliding_window / Qwen2's
// use_sliding_window + max_window_layers and corelm's linear_attention_state_size are read into
// LayerSpecs, written back so the config round-trips, and bad values are errors naming the field.
#include <gtest/gtest.h>

#include <string>

#include "corelm/error.h"
#include "corelm/model.h"

namespace corelm::model {
namespace {

using nlohmann::json;

json base_json(const std::string& type = "llama", int64_t layers = 6) {
  return {{"model_type", type},           {"vocab_size", 100},       {"hidden_size", 64},
          {"intermediate_size", 96},      {"num_hidden_layers", layers}, {"num_attention_heads", 2},
          {"num_key_value_heads", 1},     {"head_dim", 32},          {"bos_token_id", 1}};
}

template <class E, class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error; expected one containing '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LayerSpecs, PlainConfigsHaveNoSpecsAndEveryLayerIsFull) {
  ModelConfig c = ModelConfig::from_json(base_json());
  EXPECT_TRUE(c.layers.empty());
  EXPECT_TRUE(c.all_full_attention());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) EXPECT_EQ(c.layer(l), LayerSpec{});
  EXPECT_THROW(c.layer(6), IndexError);
  EXPECT_FALSE(c.to_json().contains("layer_types"));
  // layer_types that are all full attention are the same config.
  json j = base_json();
  j["layer_types"] = json::array();
  for (int l = 0; l < 6; ++l) j["layer_types"].push_back("full_attention");
  EXPECT_TRUE(ModelConfig::from_json(j).layers.empty());
}

TEST(LayerSpecs, HybridLayerTypesRoundTrip) {
  json j = base_json();
  j["layer_types"] = {"linear_attention",  "sliding_attention", "sliding_attention",
                      "linear_attention",  "sliding_attention", "linear_attention"};
  j["sliding_window"] = 256;
  j["linear_attention_state_size"] = 32;
  j["bos_isolation"] = true;
  ModelConfig c = ModelConfig::from_json(j);
  ASSERT_EQ(c.layers.size(), 6u);
  EXPECT_FALSE(c.all_full_attention());
  EXPECT_TRUE(c.bos_isolation);
  const AttentionKind want[] = {AttentionKind::Linear, AttentionKind::Sliding, AttentionKind::Sliding,
                                AttentionKind::Linear, AttentionKind::Sliding, AttentionKind::Linear};
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(c.layer(l).attention, want[l]) << l;
    EXPECT_EQ(c.layer(l).window, want[l] == AttentionKind::Sliding ? 256 : 0) << l;
    EXPECT_EQ(c.layer(l).d_state, want[l] == AttentionKind::Linear ? 32 : 0) << l;
  }
  json out = c.to_json();
  EXPECT_EQ(out["layer_types"], j["layer_types"]);
  EXPECT_EQ(out["sliding_window"], 256);
  EXPECT_EQ(out["linear_attention_state_size"], 32);
  EXPECT_EQ(out["bos_isolation"], true);
  EXPECT_EQ(out["model_type"], "corelm_hybrid");  // mixed kinds with linear layers: corelm's own
  ModelConfig back = ModelConfig::from_json(out);
  EXPECT_EQ(back.layers, c.layers);
  EXPECT_EQ(back.to_json(), out);
}

TEST(LayerSpecs, MistralSlidingWindowMakesEverySlidingAndIsWrittenAsMistral) {
  json j = base_json("mistral", 3);
  j["sliding_window"] = 16;
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.model_type, "llama");
  ASSERT_EQ(c.layers.size(), 3u);
  for (const LayerSpec& s : c.layers) EXPECT_EQ(s, (LayerSpec{AttentionKind::Sliding, 16, 0, FfnKind::Dense}));
  json out = c.to_json();
  EXPECT_EQ(out["model_type"], "mistral");
  EXPECT_EQ(out["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(ModelConfig::from_json(out).layers, c.layers);
  // sliding_window null: a Mistral without a window is a Llama.
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(ModelConfig::from_json(j).layers.empty());
  // The architecture alone also says Mistral.
  json a = base_json("", 2);
  a.erase("model_type");
  a["architectures"] = {"MistralForCausalLM"};
  a["sliding_window"] = 8;
  EXPECT_EQ(ModelConfig::from_json(a).layer(1).window, 8);
}

TEST(LayerSpecs, Qwen2WindowAppliesFromMaxWindowLayersOn) {
  json j = base_json("qwen2", 4);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 64;
  j["max_window_layers"] = 1;
  ModelConfig c = ModelConfig::from_json(j);
  ASSERT_EQ(c.layers.size(), 4u);
  EXPECT_EQ(c.layer(0).attention, AttentionKind::Full);
  for (int l = 1; l < 4; ++l) EXPECT_EQ(c.layer(l).window, 64);
  json out = c.to_json();
  EXPECT_EQ(out["use_sliding_window"], true);
  EXPECT_EQ(out["max_window_layers"], 1);
  EXPECT_EQ(ModelConfig::from_json(out).layers, c.layers);
  j["use_sliding_window"] = false;
  EXPECT_TRUE(ModelConfig::from_json(j).layers.empty());
}

TEST(LayerSpecs, BadSpecsAreErrorsNamingTheField) {
  json j = base_json();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  expect_error<FormatError>([&] { ModelConfig::from_json(j, "m/config.json"); }, "lists 2 layers");
  j["layer_types"] = {"full_attention", "full_attention", "mamba", "full_attention", "full_attention",
                      "full_attention"};
  expect_error<FormatError>([&] { ModelConfig::from_json(j, "m/config.json"); }, "layer_types'[2]");
  j["layer_types"][2] = "sliding_attention";
  expect_error<FormatError>([&] { ModelConfig::from_json(j, "m/config.json"); }, "'sliding_window'");
  j["sliding_window"] = 0;
  expect_error<FormatError>([&] { ModelConfig::from_json(j, "m/config.json"); }, "must be positive");
  j["sliding_window"] = 32;
  j["layer_types"][3] = "linear_attention";
  expect_error<FormatError>([&] { ModelConfig::from_json(j, "m/config.json"); }, "'linear_attention_state_size'");
  j["linear_attention_state_size"] = 32;
  EXPECT_NO_THROW(ModelConfig::from_json(j));
  j["layer_types"] = "full_attention";
  expect_error<FormatError>([&] { ModelConfig::from_json(j, "m/config.json"); }, "must be a list");
  json iso = base_json();
  iso.erase("bos_token_id");
  iso["bos_isolation"] = true;
  expect_error<ValueError>([&] { ModelConfig::from_json(iso, "m/config.json"); }, "bos_isolation");
  // validate() checks specs built in code too.
  ModelConfig c = ModelConfig::from_json(base_json("llama", 2));
  c.layers = {LayerSpec{AttentionKind::Sliding, 0, 0, FfnKind::Dense}, LayerSpec{}};
  expect_error<ValueError>([&] { c.validate(); }, "layer 0 (sliding_attention) has window 0");
  c.layers = {LayerSpec{AttentionKind::Full, 5, 0, FfnKind::Dense}, LayerSpec{}};
  expect_error<ValueError>([&] { c.validate(); }, "only sliding layers");
  c.layers = {LayerSpec{}};
  expect_error<ValueError>([&] { c.validate(); }, "1 layer specs for 2 layers");
  EXPECT_EQ(parse_attention_kind("linear_attention"), AttentionKind::Linear);
  expect_error<ValueError>([&] { parse_attention_kind("swa"); }, "full_attention, sliding_attention");
}

TEST(LayerSpecs, DecoderBuildsEveryKind) {
  json j = base_json("mistral", 2);
  j["sliding_window"] = 4;
  Decoder d(ModelConfig::from_json(j));
  EXPECT_TRUE(d.has_parameter("model.layers.1.self_attn.q_proj.weight"));
}

}  // namespace
}  // namespace corelm::model
