// The architecture name table (corelm/architecture.h): HF <-> llama.cpp <-> llama2.c names, Llama
// models written to and read from GGUF (metadata, the q/k permutation, shape checks, k-quant row
// fallback) and llama2.c checkpoints turned into the decoder's config and HF-named parameters.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "corelm/architecture.h"
#include "corelm/error.h"
#include "corelm/gguf.h"
#include "corelm/llama2c.h"
#include "corelm/model.h"
#include "corelm/random.h"

namespace corelm::model {
namespace {

namespace fs = std::filesystem;
using io::GGMLType;
using io::GGUFFile;
using io::ggml_type_name;

class GGUFModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_arch_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  fs::path dir_;
};

// 0, 1, ..., n-1 as f32 (built by hand: these tests should not depend on dtype conversion).
Tensor iota(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return Tensor::from_vector(v, {n});
}

// Every HF name maps to a llama.cpp name and back, and the table covers every parameter the
// decoder defines (an untied llama with biases).
TEST(ArchitectureNames, TableCoversTheDecoderAndRoundTrips) {
  ModelConfig c;
  c.vocab_size = 10, c.hidden_size = 8, c.intermediate_size = 12, c.num_hidden_layers = 2;
  c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 4, c.tie_word_embeddings = false;
  c.attention_bias = true;
  for (const auto& [name, shape] : parameter_shapes(c)) {
    const std::string g = gguf_name_from_hf(name);
    EXPECT_EQ(hf_name_from_gguf(g), name);
  }
  for (const auto& n : layer_parameter_names()) EXPECT_NE(n.llama2c, nullptr) << n.hf;
}

// A vocab-only file written by llama.cpp's converter is not a model: the loader names the missing tensor.
TEST(GGUFRealFiles, VocabOnlyFileIsNotAModel) {
  const fs::path dir = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data" / "tokenizers" / "llama.cpp-vocab-tests";
  if (!fs::exists(dir / "ggml-vocab-llama-spm.gguf"))
    GTEST_SKIP() << "llama.cpp vocab GGUFs not found under " << dir.string() << " (shared data set absent)";
  try {
    load_gguf_model((dir / "ggml-vocab-llama-spm.gguf").string());
    ADD_FAILURE() << "loaded a vocab-only file as a model";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("token_embd.weight"), std::string::npos) << e.what();
  }
}

TEST(ArchitectureNames, NamesFollowLlamaCpp) {
  EXPECT_EQ(gguf_name_from_hf("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_name_from_hf("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_name_from_hf("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.11.self_attn.o_proj.weight"), "blk.11.attn_output.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
  EXPECT_EQ(gguf_name_from_hf("model.layers.2.post_attention_layernorm.weight"), "blk.2.ffn_norm.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.3.ffn_gate.weight"), "model.layers.3.mlp.gate_proj.weight");
  EXPECT_THROW(gguf_name_from_hf("model.layers.0.mystery.weight"), ValueError);
  EXPECT_THROW(hf_name_from_gguf("blk.0.attn_qkv.weight"), ValueError);
}

nlohmann::json tiny_config() {
  return {{"model_type", "llama"}, {"vocab_size", 6}, {"hidden_size", 8}, {"intermediate_size", 32},
          {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
          {"max_position_embeddings", 16}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
          {"tie_word_embeddings", true}};
}

std::vector<std::pair<std::string, Tensor>> tiny_tensors(Generator& gen) {
  return {{"model.embed_tokens.weight", Tensor::randn({6, 8}, gen)},
          {"model.layers.0.input_layernorm.weight", Tensor::randn({8}, gen)},
          {"model.layers.0.self_attn.q_proj.weight", iota(64).view({8, 8})},
          {"model.layers.0.self_attn.k_proj.weight", iota(32).view({4, 8})},
          {"model.layers.0.self_attn.v_proj.weight", Tensor::randn({4, 8}, gen)},
          {"model.layers.0.self_attn.o_proj.weight", Tensor::randn({8, 8}, gen)},
          {"model.layers.0.post_attention_layernorm.weight", Tensor::randn({8}, gen)},
          {"model.layers.0.mlp.gate_proj.weight", Tensor::randn({32, 8}, gen)},
          {"model.layers.0.mlp.up_proj.weight", Tensor::randn({32, 8}, gen)},
          {"model.layers.0.mlp.down_proj.weight", Tensor::randn({8, 32}, gen)},
          {"model.norm.weight", Tensor::randn({8}, gen)}};
}

TEST_F(GGUFModelTest, LlamaModelRoundTripWithQKPermutation) {
  Generator gen(5);
  auto tensors = tiny_tensors(gen);
  save_gguf_model(path("llama.gguf"), tiny_config(), tensors);
  auto f = GGUFFile::open(path("llama.gguf"));
  EXPECT_EQ(f.at("general.architecture").as_string(), "llama");
  EXPECT_EQ(f.at("llama.attention.head_count_kv").as_int(), 1);
  EXPECT_EQ(f.at("llama.embedding_length").as_int(), 8);
  // Stored q rows are llama.cpp's interleaved order: per head of 4, HF rows 0, 2, 1, 3.
  auto q = f.get("blk.0.attn_q.weight").to_float_vector();
  const int64_t order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(q[r * 8], static_cast<float>(order[r] * 8)) << r;
  EXPECT_EQ(f.info("blk.0.attn_norm.weight").type, GGMLType::F32);
  auto m = load_gguf_model(path("llama.gguf"));
  EXPECT_EQ(m.config.at("num_key_value_heads"), 1);
  EXPECT_EQ(m.config.at("tie_word_embeddings"), true);
  ASSERT_EQ(m.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(m.tensors[i].first, tensors[i].first);
    EXPECT_EQ(m.tensors[i].second.to_float_vector(), tensors[i].second.to_float_vector()) << tensors[i].first;
  }
  // Q8_0: 2-D weights with rows of 32 quantised, others F16, norms F32.
  save_gguf_model(path("q8.gguf"), tiny_config(), tensors, GGMLType::Q8_0);
  auto q8 = GGUFFile::open(path("q8.gguf"));
  EXPECT_EQ(q8.info("blk.0.ffn_down.weight").type, GGMLType::Q8_0);
  EXPECT_EQ(q8.info("blk.0.attn_q.weight").type, GGMLType::F16);
  EXPECT_EQ(q8.info("output_norm.weight").type, GGMLType::F32);
  EXPECT_EQ(q8.at("general.file_type").as_int(), 7);
}

TEST_F(GGUFModelTest, LlamaModelShapeMismatchAndMissingTensorNameTheTensor) {
  Generator gen(5);
  auto tensors = tiny_tensors(gen);
  tensors[9].second = Tensor::randn({8, 64}, gen);  // down_proj with the wrong FFN size
  save_gguf_model(path("bad.gguf"), tiny_config(), tensors);
  try {
    load_gguf_model(path("bad.gguf"));
    ADD_FAILURE() << "loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_down.weight"), std::string::npos) << e.what();
  }
  // Found by fuzz_gguf_reader: a vocab_size of 2^31 - 1 with a small token_embd once made the
  // shape-mismatch message allocate a tensor of the implied shape (19 GB). Now a plain error.
  nlohmann::json huge = tiny_config();
  huge["vocab_size"] = 2147483647;
  save_gguf_model(path("huge.gguf"), huge, tiny_tensors(gen));
  try {
    load_gguf_model(path("huge.gguf"));
    ADD_FAILURE() << "loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("token_embd.weight' has shape"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2147483647"), std::string::npos) << e.what();
  }
  huge = tiny_config();
  huge["num_hidden_layers"] = int64_t{1} << 40;
  save_gguf_model(path("layers.gguf"), huge, tiny_tensors(gen));
  EXPECT_THROW(load_gguf_model(path("layers.gguf")), FormatError);
  tensors = tiny_tensors(gen);
  tensors.erase(tensors.begin() + 3);
  save_gguf_model(path("missing.gguf"), tiny_config(), tensors);
  try {
    load_gguf_model(path("missing.gguf"));
    ADD_FAILURE() << "loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_k.weight"), std::string::npos) << e.what();
  }
}

TEST_F(GGUFModelTest, KQuantRowsThatDoNotFitFallBack) {
  // hidden 64: the k-quants' 256-value blocks do not divide the rows; ffn_down's rows of 256 do.
  nlohmann::json c = {{"model_type", "llama"}, {"vocab_size", 8}, {"hidden_size", 64}, {"intermediate_size", 256},
                      {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"num_key_value_heads", 2},
                      {"max_position_embeddings", 16}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                      {"tie_word_embeddings", true}};
  Generator gen(1);
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"model.embed_tokens.weight", Tensor::randn({8, 64}, gen)},
      {"model.layers.0.input_layernorm.weight", Tensor::randn({64}, gen)},
      {"model.layers.0.self_attn.q_proj.weight", Tensor::randn({64, 64}, gen)},
      {"model.layers.0.self_attn.k_proj.weight", Tensor::randn({64, 64}, gen)},
      {"model.layers.0.self_attn.v_proj.weight", Tensor::randn({64, 64}, gen)},
      {"model.layers.0.self_attn.o_proj.weight", Tensor::randn({64, 64}, gen)},
      {"model.layers.0.post_attention_layernorm.weight", Tensor::randn({64}, gen)},
      {"model.layers.0.mlp.gate_proj.weight", Tensor::randn({256, 64}, gen)},
      {"model.layers.0.mlp.up_proj.weight", Tensor::randn({256, 64}, gen)},
      {"model.layers.0.mlp.down_proj.weight", Tensor::randn({64, 256}, gen)},
      {"model.norm.weight", Tensor::randn({64}, gen)}};
  const std::pair<GGMLType, GGMLType> expect[] = {
      {GGMLType::Q4_K, GGMLType::Q5_0}, {GGMLType::Q5_K, GGMLType::Q5_1}, {GGMLType::Q6_K, GGMLType::Q8_0}};
  for (const auto& [k, fallback] : expect) {
    save_gguf_model(path("m.gguf"), c, ts, k);
    auto f = GGUFFile::open(path("m.gguf"));
    EXPECT_EQ(f.info("blk.0.ffn_down.weight").type, k);
    EXPECT_EQ(f.info("blk.0.attn_q.weight").type, fallback) << ggml_type_name(k);
    EXPECT_EQ(f.info("token_embd.weight").type, fallback) << ggml_type_name(k);
    EXPECT_EQ(f.info("output_norm.weight").type, GGMLType::F32);
    auto m = load_gguf_model(path("m.gguf"));  // and it loads back
    EXPECT_EQ(m.tensors.size(), ts.size());
  }
}


// llama2.c: dim 8 = 2 heads of 4, 1 KV head, FFN 6, 1 layer, vocab 5, seq_len 3; float k of the
// file holds the value k, so every tensor's origin is visible.
std::string llama2c_file(int32_t vocab_field, int64_t n_floats) {
  std::string s(28, '\0');
  int32_t h[7] = {8, 6, 1, 2, 1, vocab_field, 3};
  std::memcpy(s.data(), h, 28);
  for (int64_t k = 0; k < n_floats; ++k) {
    float f = static_cast<float>(k);
    s.append(reinterpret_cast<const char*>(&f), 4);
  }
  return s;
}
constexpr int64_t D = 8, H = 6, V = 5, KV = 4, kTied = V * D + (2 * D + D * D + 2 * D * KV + D * D + 3 * D * H) + D + 3 * 4;

TEST_F(GGUFModelTest, Llama2cCheckpointBecomesHfNamesWithRopeRowsUnpermuted) {
  std::ofstream(path("m.bin"), std::ios::binary) << llama2c_file(V, kTied);
  Llama2cModel m = load_llama2c_model(path("m.bin"));
  EXPECT_EQ(m.config.at("hidden_size"), D);
  EXPECT_EQ(m.config.at("num_key_value_heads"), 1);
  EXPECT_EQ(m.config.at("tie_word_embeddings"), true);
  ASSERT_EQ(m.tensors.size(), 1u + 9u + 1u);
  EXPECT_EQ(m.tensors[0].first, "model.embed_tokens.weight");
  EXPECT_EQ(m.tensors[0].second.shape(), (Shape{V, D}));
  EXPECT_EQ(m.tensors.back().first, "model.norm.weight");
  std::map<std::string, Tensor> by_name(m.tensors.begin(), m.tensors.end());
  Tensor q = by_name.at("model.layers.0.self_attn.q_proj.weight");
  ASSERT_EQ(q.shape(), (Shape{D, D}));
  const int64_t wq_start = V * D + D;
  // Head 0 rows in HF order are llama2.c rows 0, 2, 1, 3; head 1: 4, 6, 5, 7.
  const int64_t order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  auto qv = q.to_float_vector();
  for (int64_t r = 0; r < D; ++r) EXPECT_EQ(qv[r * D], static_cast<float>(wq_start + order[r] * D)) << "row " << r;
  Tensor k = by_name.at("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.shape(), (Shape{KV, D}));
  EXPECT_EQ(k.to_float_vector()[1 * D], static_cast<float>(wq_start + D * D + 2 * D));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.weight").shape(), (Shape{D, H}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.up_proj.weight").shape(), (Shape{H, D}));
  EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
  // A negative vocab field: a separate classifier, after everything else.
  std::ofstream(path("u.bin"), std::ios::binary) << llama2c_file(-V, kTied + V * D);
  Llama2cModel u = load_llama2c_model(path("u.bin"));
  EXPECT_EQ(u.config.at("vocab_size"), V);
  EXPECT_EQ(u.config.at("tie_word_embeddings"), false);
  ASSERT_EQ(u.tensors.back().first, "lm_head.weight");
  EXPECT_EQ(u.tensors.back().second.to_float_vector()[0], static_cast<float>(kTied));
}

}  // namespace
}  // namespace corelm::model
