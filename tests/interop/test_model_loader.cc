// load_model / save_model (include/corelm/model_loader.h): every format round trip through the
// one loader -- corelm/HF folders (sharded or not), GGUF (f32/bf16/f16 identical, q8_0 within a
// bound), llama2.c -- plus index.json validation, unsupported-config errors, and the GGUF "gpt2"
// tokenizer metadata written from and read back into our BPE tokenizer.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "common/tensor_factories.h"
#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/model_loader.h"
#include "corelm/safetensors.h"
#include "corelm/tokenizer_train.h"

namespace corelm {
namespace {

namespace fs = std::filesystem;
using model::Checkpoint;
using model::LoadOptions;
using nlohmann::json;

const fs::path kData = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data";

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("corelm_loader_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

json small_config(const std::string& type, bool tied) {
  return {{"model_type", type},         {"vocab_size", 320},         {"hidden_size", 64},
          {"intermediate_size", 96},    {"num_hidden_layers", 2},    {"num_attention_heads", 4},
          {"num_key_value_heads", 2},   {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},      {"tie_word_embeddings", tied}};
}

// A decoder with every parameter random (norms around 1), wrapped as a checkpoint without tokenizer.
Checkpoint random_checkpoint(const json& config, uint64_t seed) {
  model::Decoder d(model::ModelConfig::from_json(config));
  for (const auto& [name, p] : d.named_parameters()) {
    Tensor t = testing::random_tensor(p.shape(), seed++, 0.08f);
    if (name.ends_with("norm.weight")) {
      std::vector<float> v = t.to_float_vector();
      for (float& x : v) x = 1.0f + 2.5f * x;
      t = Tensor::from_vector(v, p.shape());
    }
    d.load_parameter(name, t);
  }
  return Checkpoint{model::LoadedModel{std::move(d), nullptr}, "model-dir", {}, -1, {}, {}};
}

LoadOptions no_tokenizer() {
  LoadOptions o;
  o.require_tokenizer = false;
  return o;
}

std::vector<float> logits(const model::Decoder& d) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * 11; ++i) ids.push_back((i * 37 + 5) % d.config().vocab_size);
  return d.forward(Tensor::from_vector(ids, {2, 11})).to_float_vector();
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// What a weight becomes when stored as `dtype` (2-D weights only; norms and biases stay f32).
Tensor stored_as(const Tensor& t, DType dtype) { return t.dim() == 2 ? t.to(dtype).to(DType::F32) : t; }

class GgufRoundTrip : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GgufRoundTrip, TensorsAndLogitsSurvive) {
  const auto& [type, dtype] = GetParam();
  TempDir dir;
  Checkpoint src = random_checkpoint(small_config(type, type == "llama"), 11);
  model::SaveOptions so;
  so.dtype = dtype;
  model::save_model(src, dir / "m.gguf", so);
  Checkpoint back = model::load_model(dir / "m.gguf", no_tokenizer());
  EXPECT_EQ(back.format, "gguf");
  EXPECT_EQ(back.model.decoder.config().attention_bias, type == "qwen2");

  // The reference: the source decoder with its weights rounded the way the file stores them.
  model::Decoder expect(src.model.decoder.config());
  double worst = 0;
  for (const auto& [name, p] : src.model.decoder.named_parameters()) {
    Tensor want = dtype == "bf16" ? stored_as(p, DType::BF16) : dtype == "f16" ? stored_as(p, DType::F16) : p;
    expect.load_parameter(name, want);
    const double d = max_abs_diff(back.model.decoder.parameter(name).to_float_vector(), want.to_float_vector());
    if (dtype == "q8_0") {
      worst = std::max(worst, d);
    } else {
      EXPECT_EQ(d, 0.0) << name << " changed in the " << dtype << " round trip";
    }
  }
  const double logit_diff = max_abs_diff(logits(back.model.decoder), logits(expect));
  if (dtype == "q8_0") {
    // Q8_0: |error| <= scale/2 = max|block|/254 per weight; weights ~ N(0, 0.08) stay under 4e-3.
    EXPECT_LT(worst, 4e-3);
    EXPECT_LT(logit_diff, 0.1) << "q8_0 logits";  // measured 0.044 (logits of magnitude ~3)
    std::printf("GGUF q8_0 %s: max weight err %.3g, max logit diff %.3g\n", type.c_str(), worst, logit_diff);
  } else {
    EXPECT_EQ(logit_diff, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GgufRoundTrip,
                         ::testing::Combine(::testing::Values("llama", "qwen2"),
                                            ::testing::Values("f32", "bf16", "f16", "q8_0")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

TEST(ModelFolder, ShardedHfRoundTripWithIndex) {
  TempDir dir;
  Checkpoint src = random_checkpoint(small_config("qwen2", false), 5);
  src.eos_ids = {2, 7};
  model::SaveOptions so;
  so.to = "hf";
  so.shard_size = 60000;
  model::SaveSummary s = model::save_model(src, dir / "hf", so);
  ASSERT_TRUE(fs::exists(dir / "hf/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "hf/model.safetensors"));
  EXPECT_GT(s.files.size(), 4u);
  Checkpoint back = model::load_model(dir / "hf", no_tokenizer());
  EXPECT_EQ(back.eos_ids, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(max_abs_diff(logits(back.model.decoder), logits(src.model.decoder)), 0.0);

  // Re-saving unsharded into the same folder removes the index and the shards.
  so.shard_size = 0;
  model::save_model(back, dir / "hf", so);
  EXPECT_FALSE(fs::exists(dir / "hf/model.safetensors.index.json"));
  for (const auto& e : fs::directory_iterator(dir / "hf"))
    EXPECT_FALSE(e.path().filename().string().starts_with("model-")) << e.path();
  EXPECT_EQ(max_abs_diff(logits(model::load_model(dir / "hf", no_tokenizer()).model.decoder), logits(src.model.decoder)),
            0.0);
}

TEST(ModelFolder, Bf16FolderHoldsRoundedWeights) {
  TempDir dir;
  Checkpoint src = random_checkpoint(small_config("llama", true), 9);
  model::SaveOptions so;
  so.dtype = "bf16";
  model::save_model(src, dir / "m", so);
  EXPECT_EQ(io::SafetensorsFile::open(dir / "m/model.safetensors").get("model.embed_tokens.weight").dtype(), DType::BF16);
  Checkpoint back = model::load_model(dir / "m", no_tokenizer());
  const Tensor& w = src.model.decoder.named_parameters().front().second;
  EXPECT_EQ(max_abs_diff(back.model.decoder.named_parameters().front().second.to_float_vector(),
                         stored_as(w, DType::BF16).to_float_vector()),
            0.0);
  EXPECT_THROW(model::save_model(src, dir / "q", {"hf", "q8_0", 0, {}}), ValueError);
}

// A sharded folder the tests below corrupt one way each.
struct ShardedFolder {
  TempDir dir;
  json index;
  ShardedFolder() {
    model::SaveOptions so;
    so.shard_size = 60000;
    model::save_model(random_checkpoint(small_config("llama", true), 3), dir / "m", so);
    index = json::parse(std::ifstream(dir / "m/model.safetensors.index.json"));
  }
  std::string load_error() {
    write_text(dir / "m/model.safetensors.index.json", index.dump());
    try {
      model::load_model(dir / "m", no_tokenizer());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST(ShardIndex, MissingShardFileIsNamed) {
  ShardedFolder f;
  f.index["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
  const std::string e = f.load_error();
  EXPECT_NE(e.find("shard 'model-00009-of-00009.safetensors'"), std::string::npos) << e;
}

TEST(ShardIndex, TensorMappedToWrongShard) {
  ShardedFolder f;
  const std::string first = f.index["weight_map"]["model.embed_tokens.weight"];
  ASSERT_NE(f.index["weight_map"]["model.norm.weight"], first) << "the fixture should put them in different shards";
  f.index["weight_map"]["model.norm.weight"] = first;
  const std::string e = f.load_error();
  EXPECT_NE(e.find("tensor 'model.norm.weight' is mapped to shard '" + first + "', which does not hold it"),
            std::string::npos) << e;
}

TEST(ShardIndex, TensorInTwoShardsAndBadNames) {
  ShardedFolder f;
  // A copy of the shard holding model.norm.weight (and other tensors, still mapped to the original)
  // now named for model.norm.weight: the same tensors are stored in two shards.
  const std::string shard = f.index["weight_map"]["model.norm.weight"];
  int sharing = 0;
  for (const auto& [name, file] : f.index["weight_map"].items()) sharing += file == shard;
  ASSERT_GT(sharing, 1) << "the fixture's last shard should hold several tensors";
  fs::copy_file(f.dir / ("m/" + shard), f.dir / "m/zz-copy.safetensors");
  f.index["weight_map"]["model.norm.weight"] = "zz-copy.safetensors";
  std::string e = f.load_error();
  EXPECT_NE(e.find("is stored in two shards"), std::string::npos) << "[" << e << "]";
  f.index["weight_map"]["model.embed_tokens.weight"] = "../escape.safetensors";
  e = f.load_error();
  EXPECT_NE(e.find("is not a file name inside the checkpoint folder"), std::string::npos) << e;
  f.index.erase("weight_map");
  e = f.load_error();
  EXPECT_NE(e.find("missing object field 'weight_map'"), std::string::npos) << e;
}

TEST(ShardIndex, TensorsInAShardButNotInWeightMapAreStillRead) {
  ShardedFolder f;
  f.index["weight_map"].erase("model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(f.load_error(), "");  // a tensor absent from every file is the strict-mode error (oracle test)
}

class UnsupportedConfig : public ::testing::TestWithParam<std::pair<json, std::string>> {};

TEST_P(UnsupportedConfig, ClearErrorNamingTheField) {
  TempDir dir;
  model::save_model(random_checkpoint(small_config("llama", true), 1), dir / "m", {});
  json c = json::parse(std::ifstream(dir / "m/config.json"));
  c.update(GetParam().first);
  write_text(dir / "m/config.json", c.dump());
  try {
    model::load_model(dir / "m", no_tokenizer());
    FAIL() << "loaded " << GetParam().first.dump();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().second), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fields, UnsupportedConfig,
    ::testing::Values(std::make_pair(json{{"quantization_config", {{"quant_method", "gptq"}}}}, "'quantization_config'"),
                      std::make_pair(json{{"num_local_experts", 8}}, "'num_local_experts' (mixture of experts)"),
                      std::make_pair(json{{"kv_lora_rank", 512}}, "'kv_lora_rank' (multi-head latent attention"),
                      std::make_pair(json{{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}, "'rope_scaling'"),
                      std::make_pair(json{{"model_type", "qwen2"}, {"use_sliding_window", true}, {"sliding_window", 8}},
                                     "'use_sliding_window'")));

TEST(MistralConfig, WithASlidingWindowLoadsWithEveryLayerSliding) {
  TempDir dir;
  model::save_model(random_checkpoint(small_config("llama", true), 1), dir / "m", {});
  json c = json::parse(std::ifstream(dir / "m/config.json"));
  c["model_type"] = "mistral";
  c["sliding_window"] = 3;
  write_text(dir / "m/config.json", c.dump());
  Checkpoint back = model::load_model(dir / "m", no_tokenizer());
  const model::ModelConfig& mc = back.model.decoder.config();
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    EXPECT_EQ(mc.layer(l).attention, model::AttentionKind::Sliding) << l;
    EXPECT_EQ(mc.layer(l).window, 3) << l;
  }
}

TEST(MistralConfig, WithoutSlidingWindowLoadsAsLlama) {
  TempDir dir;
  Checkpoint src = random_checkpoint(small_config("llama", true), 1);
  model::save_model(src, dir / "m", {});
  json c = json::parse(std::ifstream(dir / "m/config.json"));
  c["model_type"] = "mistral";
  c["sliding_window"] = nullptr;
  write_text(dir / "m/config.json", c.dump());
  Checkpoint back = model::load_model(dir / "m", no_tokenizer());
  EXPECT_EQ(max_abs_diff(logits(back.model.decoder), logits(src.model.decoder)), 0.0);
}

TEST(Tokenizer, MissingTokenizerIsAClearError) {
  TempDir dir;
  model::save_model(random_checkpoint(small_config("llama", true), 1), dir / "m.gguf", {});
  try {
    model::load_model(dir / "m.gguf");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--tokenizer"), std::string::npos);
  }
}

// A small byte-level BPE tokenizer trained here (no external data needed).
std::string train_tokenizer(const TempDir& dir, const std::string& pattern) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "The quick brown fox " + std::to_string(i * 7) + " jumps over the lazy dog's back. Caf\xc3\xa9!\n";
  write_text(dir / "corpus.txt", text);
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.pattern = pattern;
  const std::string out = dir / ("tokenizer_" + pattern + ".json");
  train_bpe({dir / "corpus.txt"}, o, out);
  return out;
}

void expect_same_tokenizer(const Tokenizer& a, const Tokenizer& b, const std::string& what) {
  for (const char* s : {"The quick brown fox 1234 jumps.", "  caf\xc3\xa9 \xf0\x9f\x98\x80\n\nx<|endoftext|>y",
                        "Hello, world! It's 2024.", "\xff\xfe raw bytes"}) {
    EncodeOptions o;
    o.parse_special = true;
    o.add_special = true;
    EXPECT_EQ(a.encode(s, o), b.encode(s, o)) << what << ": " << s;
  }
  EXPECT_EQ(a.bos_id(), b.bos_id()) << what;
  EXPECT_EQ(a.eos_id(), b.eos_id()) << what;
}

TEST(GgufBpeVocab, TrainedTokenizersRoundTrip) {
  TempDir dir;
  for (const std::string pattern : {"gpt2", "llama3", "qwen2"}) {
    const std::string path = train_tokenizer(dir, pattern);
    GgufBpeVocab v = gguf_bpe_vocab_from_file(path, 320);
    EXPECT_EQ(v.pre, pattern == "gpt2" ? "gpt-2" : pattern == "llama3" ? "llama-bpe" : "qwen2");
    EXPECT_EQ(v.tokens.size(), 320u);
    EXPECT_EQ(v.token_types.back(), 5) << "padding ids are unused tokens";
    auto original = Tokenizer::load(path);
    auto back = tokenizer_from_gguf_bpe(v, "test.gguf");
    expect_same_tokenizer(*original, *back, pattern);
    // ... and again through tokenizer.json text.
    write_text(dir / "again.json", gguf_bpe_vocab_to_tokenizer_json(v, "test.gguf"));
    expect_same_tokenizer(*original, *Tokenizer::load(dir / "again.json"), pattern + " via tokenizer.json");
  }
}

TEST(GgufBpeVocab, RealTokenizersRoundTrip) {
  int found = 0;
  for (const char* name : {"gpt2/tokenizer.json", "llama3/tokenizer.json.zst", "qwen3/tokenizer.json.zst"}) {
    const fs::path p = kData / "tokenizers" / name;
    if (!fs::exists(p)) continue;
    ++found;
    GgufBpeVocab v = gguf_bpe_vocab_from_file(p.string());
    expect_same_tokenizer(*Tokenizer::load(p.string()), *tokenizer_from_gguf_bpe(v, name), name);
  }
  if (found == 0) GTEST_SKIP() << "no tokenizers under " << (kData / "tokenizers").string() << " (shared data absent)";
}

TEST(GgufBpeVocab, UnknownPreTokenizerIsNamed) {
  GgufBpeVocab v;
  v.tokens = {"a"};
  v.pre = "deepseek-coder";
  EXPECT_THROW(
      {
        try {
          tokenizer_from_gguf_bpe(v, "x.gguf");
        } catch (const FormatError& e) {
          EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.pre 'deepseek-coder'"), std::string::npos);
          throw;
        }
      },
      FormatError);
}

// HF folder (with our BPE tokenizer) -> GGUF via save_model -> both generate the same greedy text.
TEST(Convert, HfToGgufGeneratesTheSameGreedyTokens) {
  TempDir dir;
  Checkpoint src = random_checkpoint(small_config("llama", false), 21);
  model::save_model(src, dir / "hf", {"hf", "f32", 0, {}});
  fs::copy_file(train_tokenizer(dir, "gpt2"), dir / "hf/tokenizer.json");
  Checkpoint hf = model::load_model(dir / "hf");
  model::SaveSummary s = model::save_model(hf, dir / "m.gguf", {});
  EXPECT_TRUE(s.tokenizer_written);
  Checkpoint gguf = model::load_model(dir / "m.gguf");
  ASSERT_NE(gguf.model.tokenizer, nullptr);
  infer::GenerateOptions o;
  o.max_new_tokens = 24;
  o.sampling.greedy = true;
  o.stop_at_eos = false;
  const auto a = infer::TextGenerator(hf.model.decoder, *hf.model.tokenizer).generate("The quick brown", o);
  const auto b = infer::TextGenerator(gguf.model.decoder, *gguf.model.tokenizer).generate("The quick brown", o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  // GGUF -> folder rebuilds tokenizer.json from the GGUF vocabulary.
  model::save_model(gguf, dir / "back", {"corelm", "f32", 0, {}});
  Checkpoint again = model::load_model(dir / "back");
  EXPECT_EQ(infer::TextGenerator(again.model.decoder, *again.model.tokenizer).generate("The quick brown", o).tokens,
            a.tokens);
}

TEST(Convert, Llama2cToGgufAndFolderKeepLogits) {
  const fs::path d = kData / "models" / "stories260K";
  if (!fs::exists(d / "stories260K.bin")) GTEST_SKIP() << "stories260K absent under " << d.string();
  TempDir dir;
  LoadOptions o;
  o.tokenizer_path = (d / "tok512.bin").string();
  Checkpoint src = model::load_model((d / "stories260K.bin").string(), o);
  EXPECT_EQ(src.format, "llama2c");
  model::save_model(src, dir / "s.gguf", {});
  model::save_model(src, dir / "s", {"corelm", "f32", 100000, {}});
  for (const std::string& p : {dir / "s.gguf", dir / "s"}) {
    Checkpoint back = model::load_model(p);
    EXPECT_EQ(max_abs_diff(logits(back.model.decoder), logits(src.model.decoder)), 0.0) << p;
    EncodeOptions eo;
    eo.add_special = true;
    EXPECT_EQ(back.model.tokenizer->encode("Once upon a time", eo), src.model.tokenizer->encode("Once upon a time", eo))
        << p;
  }
}

}  // namespace
}  // namespace corelm
