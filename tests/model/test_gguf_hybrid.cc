// The hybrid (sliding-window + linear-attention layers, docs/HYBRID.md) as a corelm_hybrid GGUF
// file (src/model/gguf_hybrid.cc, docs/INTEROP.md): the keys and tensor names written, the q/k
// permutation of rotary layers only, F32 round trip with identical logits, Q8_0 within a bound,
// and a FormatError naming the key or tensor for each malformed corelm key or missing tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "corelm/architecture.h"
#include "corelm/error.h"
#include "corelm/gguf.h"
#include "corelm/model.h"
#include "corelm/model_loader.h"
#include "corelm/ops.h"
#include "corelm/random.h"

namespace corelm::model {
namespace {

namespace fs = std::filesystem;
using io::GGMLType;
using io::GGUFFile;
using io::GGUFType;
using io::GGUFValue;
using io::GGUFWriteTensor;
using Metadata = std::vector<std::pair<std::string, GGUFValue>>;

// lin, swa(3), full, lin: every kind, a window shorter than the prompts, GQA 2/1; head_dim and
// d_state 32 so that the decay [1, 32] is a tensor Q8_0 could quantise (it must stay F32).
ModelConfig hybrid_config(bool tied = true) {
  ModelConfig c;
  c.vocab_size = 61;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 32;
  c.max_position_embeddings = 64;
  c.rope_theta = 5000.0;
  c.rms_norm_eps = 1e-6;
  c.initializer_range = 0.2;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  c.bos_isolation = true;
  const LayerSpec lin{AttentionKind::Linear, 0, 32, FfnKind::Dense};
  c.layers = {lin, LayerSpec{AttentionKind::Sliding, 3, 0, FfnKind::Dense}, LayerSpec{}, lin};
  return c;
}

// Random values everywhere, norms and decays included, so that a swapped or dropped tensor shows.
Decoder random_decoder(const ModelConfig& c, uint64_t seed) {
  Decoder d(c);
  d.init_weights(seed);
  Generator g(seed + 1);
  for (const auto& [name, t] : d.named_parameters()) {
    if (name.find("norm") != std::string::npos)
      d.load_parameter(name, ops::add_scalar(Tensor::randn(t.shape(), g, 0.3f), 1.0f));
    if (name.find("decay") != std::string::npos) d.load_parameter(name, ops::add(t, Tensor::randn(t.shape(), g, 0.5f)));
  }
  return d;
}

// 13 tokens (> window 3), BOS only first.
Tensor prompt() {
  std::vector<int64_t> v = {1, 5, 9, 22, 40, 3, 17, 60, 8, 33, 12, 7, 51};
  return Tensor::from_vector(v, {1, static_cast<int64_t>(v.size())});
}

// No vocabulary in these files: the model alone.
Checkpoint load(const std::string& file) {
  LoadOptions o;
  o.require_tokenizer = false;
  return load_model(file, o);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_float_vector(), y = b.to_float_vector();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(x[i] - y[i])));
  return m;
}

class GGUFHybridTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_ggufh_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }

  std::string write_good(const std::string& name, const Decoder& d, GGMLType t = GGMLType::F32) {
    save_gguf_model(path(name), d.config().to_json(), d.named_parameters(), t);
    return path(name);
  }
  // Copies `src` to `name` after editing its metadata and tensors in memory (io writer API).
  std::string rewrite(const std::string& src, const std::string& name, const std::function<void(Metadata&)>& kv_edit,
                      const std::function<void(std::vector<GGUFWriteTensor>&)>& t_edit = {}) {
    const GGUFFile f = GGUFFile::open(src);
    Metadata kv = f.metadata();
    std::vector<GGUFWriteTensor> ts;
    for (const auto& info : f.tensors()) ts.push_back({info.name, f.get(info.name), info.type});
    kv_edit(kv);
    if (t_edit) t_edit(ts);
    io::save_gguf(path(name), kv, ts);
    return path(name);
  }
  fs::path dir_;
};

void set_key(Metadata& kv, const std::string& key, const GGUFValue& v) {
  for (auto& [k, old] : kv)
    if (k == key) {
      old = v;
      return;
    }
  kv.emplace_back(key, v);
}
void drop_key(Metadata& kv, const std::string& key) {
  std::erase_if(kv, [&](const auto& e) { return e.first == key; });
}

// The load fails with a FormatError whose message holds every `parts`.
void expect_format_error(const std::string& file, const std::vector<std::string>& parts) {
  try {
    load_gguf_model(file);
    ADD_FAILURE() << file << " loaded";
  } catch (const FormatError& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(ArchitectureNames, HybridRolesMapBothWays) {
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.self_attn.decay"), "blk.3.attn_decay");
  EXPECT_EQ(gguf_name_from_hf("model.layers.0.self_attn.out_norm.weight"), "blk.0.attn_out_norm.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.12.attn_decay"), "model.layers.12.self_attn.decay");
  EXPECT_EQ(hf_name_from_gguf("blk.1.attn_out_norm.weight"), "model.layers.1.self_attn.out_norm.weight");
  // The decay is a raw parameter: no suffixed spelling; the out norm has no raw one.
  EXPECT_THROW(gguf_name_from_hf("model.layers.0.self_attn.decay.weight"), ValueError);
  EXPECT_THROW(hf_name_from_gguf("blk.0.attn_decay.weight"), ValueError);
  EXPECT_THROW(hf_name_from_gguf("blk.0.attn_out_norm"), ValueError);
  int64_t layer = -1;
  const ParameterName* p = find_layer_parameter("model.layers.7.self_attn.k_proj.weight", &layer);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->rope_rows);
  EXPECT_EQ(layer, 7);
  EXPECT_EQ(find_layer_parameter("model.norm.weight"), nullptr);
  ASSERT_NE(find_layer_parameter("model.layers.99999999999999999999.self_attn.decay", &layer), nullptr);
  EXPECT_EQ(layer, -1);  // a file's absurd layer number is no exception
  // Every parameter of the hybrid has a name in the table.
  for (const auto& [name, shape] : parameter_shapes(hybrid_config(false)))
    EXPECT_EQ(hf_name_from_gguf(gguf_name_from_hf(name)), name);
}

TEST_F(GGUFHybridTest, KeysTensorNamesTypesAndPermutation) {
  Decoder m = random_decoder(hybrid_config(), 3);
  const Decoder& d = m;
  const GGUFFile f = GGUFFile::open(write_good("h.gguf", d, GGMLType::Q8_0));
  EXPECT_EQ(f.at("general.architecture").as_string(), "corelm_hybrid");
  EXPECT_EQ(f.at("corelm_hybrid.block_count").as_int(), 4);
  EXPECT_EQ(f.at("corelm_hybrid.attention.head_count_kv").as_int(), 1);
  EXPECT_EQ(f.at("corelm_hybrid.attention.key_length").as_int(), 32);
  EXPECT_EQ(f.at("corelm_hybrid.layer_types").as_array(GGUFType::String).strings(),
            (std::vector<std::string>{"linear_attention", "sliding_attention", "full_attention", "linear_attention"}));
  EXPECT_EQ(f.at("corelm_hybrid.attention.sliding_window").as_int(), 3);
  EXPECT_EQ(f.at("corelm_hybrid.linear_attention.state_size").as_int(), 32);
  EXPECT_TRUE(f.at("corelm_hybrid.bos_isolation").as_bool());
  EXPECT_EQ(f.at("tokenizer.ggml.bos_token_id").as_int(), 1);  // from the config: no vocabulary given
  EXPECT_EQ(f.find("llama.block_count"), nullptr);
  EXPECT_EQ(f.find("output.weight"), nullptr);  // tied: no output.weight, as llama
  // Small tensors stay F32 under Q8_0 (the decay's rows of 32 would fit a block), weights do not.
  EXPECT_EQ(f.info("blk.0.attn_decay").type, GGMLType::F32);
  EXPECT_EQ(f.info("blk.0.attn_out_norm.weight").type, GGMLType::F32);
  EXPECT_EQ(f.info("blk.0.attn_norm.weight").type, GGMLType::F32);
  EXPECT_EQ(f.info("blk.0.attn_q.weight").type, GGMLType::Q8_0);
  EXPECT_EQ(f.get("blk.3.attn_decay").to_float_vector(), m.parameter("model.layers.3.self_attn.decay").to_float_vector());

  // F32 file: the linear layer's q is stored as is, the rotary layers' q/k in llama.cpp's
  // interleaved order (the llama writer's permutation).
  const GGUFFile g = GGUFFile::open(write_good("f.gguf", d));
  EXPECT_EQ(g.get("blk.0.attn_q.weight").to_float_vector(), m.parameter("model.layers.0.self_attn.q_proj.weight").to_float_vector());
  EXPECT_EQ(g.get("blk.3.attn_k.weight").to_float_vector(), m.parameter("model.layers.3.self_attn.k_proj.weight").to_float_vector());
  for (int l : {1, 2}) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const std::string b = "blk." + std::to_string(l) + ".";
    const Tensor q = m.parameter(p + "q_proj.weight"), k = m.parameter(p + "k_proj.weight");
    EXPECT_EQ(g.get(b + "attn_q.weight").to_float_vector(), permute_rope_rows(q, 2, true).to_float_vector()) << l;
    EXPECT_EQ(g.get(b + "attn_k.weight").to_float_vector(), permute_rope_rows(k, 1, true).to_float_vector()) << l;
    EXPECT_NE(g.get(b + "attn_q.weight").to_float_vector(), q.to_float_vector()) << l;
  }
}

// save -> load_model: the same config (LayerSpecs included) and weights, logits identical on a
// prompt longer than the window; tied and untied.
TEST_F(GGUFHybridTest, F32RoundTripGivesIdenticalLogits) {
  // (tied, attention_bias): the rotary layers' q/k biases are permuted like their rows.
  for (const auto& [tied, bias] : {std::pair{true, false}, std::pair{false, false}, std::pair{true, true}}) {
    ModelConfig hc = hybrid_config(tied);
    hc.attention_bias = bias;
    Decoder d = random_decoder(hc, tied ? 5 : 6);
    if (bias) {  // HF init zeroes biases: make them visible
      Generator g(8);
      for (const auto& [name, t] : d.named_parameters())
        if (name.ends_with(".bias")) d.load_parameter(name, Tensor::randn(t.shape(), g, 0.3f));
      ASSERT_TRUE(d.has_parameter("model.layers.1.self_attn.q_proj.bias"));
    }
    const std::string file = write_good(bias ? "b.gguf" : tied ? "t.gguf" : "u.gguf", d);
    const Checkpoint ck = load(file);
    const ModelConfig& c = ck.model.decoder.config();
    EXPECT_EQ(c.layers, d.config().layers);
    EXPECT_EQ(c.bos_isolation, true);
    EXPECT_EQ(c.bos_token_id, 1);
    EXPECT_EQ(c.eos_token_id, 2);
    EXPECT_EQ(c.tie_word_embeddings, tied);
    EXPECT_EQ(c.attention_bias, bias);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.max_position_embeddings, 64);
    EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
    EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), 1e-6f);
    // Everything config.json says but the training-only initializer_range (not a GGUF key, as for llama).
    nlohmann::json want = d.config().to_json();
    want["initializer_range"] = c.initializer_range;
    EXPECT_EQ(c.to_json(), want);
    ASSERT_EQ(ck.model.decoder.named_parameters().size(), d.named_parameters().size());
    for (size_t i = 0; i < d.named_parameters().size(); ++i) {
      EXPECT_EQ(ck.model.decoder.named_parameters()[i].first, d.named_parameters()[i].first);
      EXPECT_EQ(ck.model.decoder.named_parameters()[i].second.to_float_vector(),
                d.named_parameters()[i].second.to_float_vector())
          << d.named_parameters()[i].first;
    }
    const double diff = max_abs_diff(ck.model.decoder.forward(prompt()), d.forward(prompt()));
    std::printf("hybrid GGUF F32 round trip (%s%s): max |logit diff| = %g\n", tied ? "tied" : "untied",
                bias ? ", biases" : "", diff);
    EXPECT_EQ(diff, 0.0);
  }
}

TEST_F(GGUFHybridTest, Q8_0RoundTripStaysClose) {
  const Decoder d = random_decoder(hybrid_config(), 7);
  const Checkpoint ck = load(write_good("q8.gguf", d, GGMLType::Q8_0));
  EXPECT_EQ(ck.model.decoder.config().layers, d.config().layers);
  const Tensor ref = d.forward(prompt());
  const double diff = max_abs_diff(ck.model.decoder.forward(prompt()), ref);
  double scale = 0;
  for (float v : ref.to_float_vector()) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  std::printf("hybrid GGUF Q8_0 round trip: max |logit diff| = %g (max |logit| %g)\n", diff, scale);
  EXPECT_GT(diff, 0.0);  // it really was quantised
  // Measured 0.337 of 4.64 (random weights of std 0.2 through 4 layers; stories260K's Q8_0 round
  // trip moves logits by 0.27): the bound leaves ~35% headroom, enough to catch a decay or norm
  // quantised or a permutation lost (those move logits by O(max |logit|)).
  EXPECT_LT(diff, 0.1 * scale);
}

TEST_F(GGUFHybridTest, MalformedCorelmKeysAreFormatErrorsNamingTheKey) {
  const Decoder d = random_decoder(hybrid_config(), 9);
  const std::string good = write_good("good.gguf", d);
  EXPECT_NO_THROW(load_gguf_model(good));
  const std::string lt = "corelm_hybrid.layer_types";
  auto kinds = [](std::vector<std::string> v) { return GGUFValue::of_strings(v); };
  auto u32 = [](int64_t v) { return GGUFValue::of(GGUFType::Uint32, v); };

  expect_format_error(rewrite(good, "short.gguf", [&](Metadata& kv) {
                        set_key(kv, lt, kinds({"linear_attention", "sliding_attention", "full_attention"}));
                      }),
                      {lt, "3 entries", "block_count is 4"});
  expect_format_error(rewrite(good, "kind.gguf", [&](Metadata& kv) {
                        set_key(kv, lt, kinds({"linear_attention", "moe_attention", "full_attention", "linear_attention"}));
                      }),
                      {lt + "[1]", "'moe_attention'", "is not a layer kind"});
  expect_format_error(rewrite(good, "nolt.gguf", [&](Metadata& kv) { drop_key(kv, lt); }), {"missing key " + lt});
  expect_format_error(rewrite(good, "ltint.gguf", [&](Metadata& kv) {
                        set_key(kv, lt, GGUFValue::of_ints(GGUFType::Uint32, {0, 1, 2, 3}));
                      }),
                      {lt});
  const std::string win = "corelm_hybrid.attention.sliding_window";
  expect_format_error(rewrite(good, "w0.gguf", [&](Metadata& kv) { set_key(kv, win, u32(0)); }),
                      {win, "= 0", "out of range"});
  expect_format_error(rewrite(good, "wneg.gguf", [&](Metadata& kv) {
                        set_key(kv, win, GGUFValue::of(GGUFType::Int32, -4));
                      }),
                      {win, "= -4"});
  expect_format_error(rewrite(good, "nowin.gguf", [&](Metadata& kv) { drop_key(kv, win); }),
                      {"missing key " + win, "sliding_attention"});
  const std::string ds = "corelm_hybrid.linear_attention.state_size";
  expect_format_error(rewrite(good, "ds0.gguf", [&](Metadata& kv) { set_key(kv, ds, u32(0)); }), {ds, "= 0"});
  expect_format_error(rewrite(good, "dsstr.gguf", [&](Metadata& kv) { set_key(kv, ds, GGUFValue::of_string("32")); }),
                      {ds});
  expect_format_error(rewrite(good, "nods.gguf", [&](Metadata& kv) { drop_key(kv, ds); }),
                      {"missing key " + ds, "linear_attention"});
  expect_format_error(rewrite(good, "unknown.gguf", [&](Metadata& kv) {
                        set_key(kv, "corelm_hybrid.moe.expert_count", u32(8));
                      }),
                      {"unknown key 'corelm_hybrid.moe.expert_count'"});
  expect_format_error(rewrite(good, "vlen.gguf", [&](Metadata& kv) {
                        set_key(kv, "corelm_hybrid.attention.value_length", u32(16));
                      }),
                      {"corelm_hybrid.attention.value_length", "head size 32"});
  expect_format_error(rewrite(good, "iso.gguf", [&](Metadata& kv) {
                        set_key(kv, "corelm_hybrid.bos_isolation", GGUFValue::of_string("yes"));
                      }),
                      {"corelm_hybrid.bos_isolation"});
  // bos_isolation needs a BOS id: the config check, as a FormatError naming the file.
  expect_format_error(rewrite(good, "nobos.gguf", [&](Metadata& kv) { drop_key(kv, "tokenizer.ggml.bos_token_id"); }),
                      {"nobos.gguf", "bos_isolation"});
  // A layer declared full whose tensors are a linear layer's.
  expect_format_error(rewrite(good, "relabel.gguf", [&](Metadata& kv) {
                        set_key(kv, lt, kinds({"full_attention", "sliding_attention", "full_attention", "linear_attention"}));
                      }),
                      {"unexpected tensor 'blk.0.attn_", "layer 0 is full_attention"});
}

TEST_F(GGUFHybridTest, MissingOrExtraLayerTensorsNameTheTensorAndKind) {
  const Decoder d = random_decoder(hybrid_config(), 11);
  const std::string good = write_good("good.gguf", d);
  auto drop = [](const std::string& name) {
    return [name](std::vector<GGUFWriteTensor>& ts) {
      std::erase_if(ts, [&](const GGUFWriteTensor& t) { return t.name == name; });
    };
  };
  expect_format_error(rewrite(good, "nodecay.gguf", [](Metadata&) {}, drop("blk.3.attn_decay")),
                      {"missing tensor 'blk.3.attn_decay'", "layer 3 is linear_attention"});
  expect_format_error(rewrite(good, "nonorm.gguf", [](Metadata&) {}, drop("blk.0.attn_out_norm.weight")),
                      {"missing tensor 'blk.0.attn_out_norm.weight'"});
  expect_format_error(rewrite(good, "extra.gguf", [](Metadata&) {},
                              [](std::vector<GGUFWriteTensor>& ts) {
                                Generator g(1);
                                ts.push_back({"blk.2.attn_decay", Tensor::randn({1, 32}, g), GGMLType::F32});
                              }),
                      {"unexpected tensor 'blk.2.attn_decay'", "layer 2 is full_attention"});
  expect_format_error(rewrite(good, "shape.gguf", [](Metadata&) {},
                              [](std::vector<GGUFWriteTensor>& ts) {
                                for (auto& t : ts)
                                  if (t.name == "blk.0.attn_decay") {
                                    Generator g(1);
                                    t.value = Tensor::randn({1, 64}, g);
                                  }
                              }),
                      {"tensor 'blk.0.attn_decay' has shape", "layer 0 is linear_attention"});
  // A layer number beyond int64 in a tensor name: a FormatError like any other stray tensor.
  expect_format_error(rewrite(good, "huge.gguf", [](Metadata&) {},
                              [](std::vector<GGUFWriteTensor>& ts) {
                                Generator g(1);
                                ts.push_back({"blk.99999999999999999999.attn_decay", Tensor::randn({1, 32}, g),
                                              GGMLType::F32});
                              }),
                      {"unexpected tensor 'blk.99999999999999999999.attn_decay'"});
  // A llama file holding a hybrid tensor: refused by name, not loaded as something else.
  expect_format_error(rewrite(good, "llama.gguf", [](Metadata& kv) {
                        for (auto& [k, v] : kv) {
                          if (k == "general.architecture") v = GGUFValue::of_string("llama");
                          if (k.starts_with("corelm_hybrid.")) k = "llama." + k.substr(14);
                        }
                      }),
                      {"unexpected tensor 'blk.0.attn_decay'"});
}

TEST_F(GGUFHybridTest, WriterRefusesWhatTheFormCannotHold) {
  // qwen2 biases differ from llama's: no hybrid form for a qwen2 with sliding layers.
  ModelConfig c = hybrid_config();
  c.model_type = "qwen2";
  c.attention_bias = true;
  c.layers = {LayerSpec{AttentionKind::Sliding, 3, 0, FfnKind::Dense}, LayerSpec{}, LayerSpec{}, LayerSpec{}};
  c.bos_isolation = false;
  const Decoder d(c);
  try {
    save_gguf_model(path("q.gguf"), c.to_json(), d.named_parameters());
    ADD_FAILURE() << "written";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path("q.gguf")));
  // A Mistral config (every layer sliding) is a hybrid file too, not a llama that would ignore the window.
  ModelConfig m = hybrid_config();
  m.layers = std::vector<LayerSpec>(4, LayerSpec{AttentionKind::Sliding, 3, 0, FfnKind::Dense});
  m.bos_isolation = false;
  const Decoder md = random_decoder(m, 2);
  ASSERT_EQ(m.to_json()["model_type"], "mistral");
  const std::string file = write_good("mistral.gguf", md);
  EXPECT_EQ(GGUFFile::open(file).at("general.architecture").as_string(), "corelm_hybrid");
  const Checkpoint ck = load(file);
  EXPECT_EQ(ck.model.decoder.config().layers, m.layers);
  EXPECT_EQ(max_abs_diff(ck.model.decoder.forward(prompt()), md.forward(prompt())), 0.0);
}

}  // namespace
}  // namespace corelm::model
