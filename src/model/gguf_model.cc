// Llama/Qwen2 models as llama.cpp GGUF files: architecture metadata <-> config.json keys, the
// tensor names from the architecture name table (arch_names.cc) and the q/k row permutation (see
// corelm/architecture.h). The io layer underneath only reads and writes named tensors.
#include <cmath>
#include <cstring>
#include <map>
#include <regex>

#include "corelm/architecture.h"
#include "corelm/error.h"
#include "corelm/gguf.h"
#include "corelm/utf8.h"
#include "model/gguf_hybrid.h"

namespace corelm::model {

using io::GGMLType;
using io::GGUFFile;
using io::GGUFType;
using io::GGUFValue;
using io::GGUFWriteTensor;

namespace detail {
// llama.cpp's general.file_type ("mostly X"; informational): its LLAMA_FTYPE numbers. A file whose
// weights are all one k-quant is the "_S" (small) variant of that type.
uint32_t llama_file_type(GGMLType t) {
  switch (t) {
    case GGMLType::F32: return 0;
    case GGMLType::F16: return 1;
    case GGMLType::Q4_0: return 2;
    case GGMLType::Q4_1: return 3;
    case GGMLType::Q8_0: return 7;
    case GGMLType::Q5_0: return 8;
    case GGMLType::Q5_1: return 9;
    case GGMLType::Q2_K: return 10;
    case GGMLType::Q3_K: return 11;
    case GGMLType::Q4_K: return 14;
    case GGMLType::Q5_K: return 16;
    case GGMLType::Q6_K: return 18;
    case GGMLType::BF16: return 32;
  }
  return 0;
}
// For rows a k-quant's 256-value blocks do not divide: a 32-value type of at least as many bits.
GGMLType row_fallback(GGMLType t) {
  switch (t) {
    case GGMLType::Q2_K: case GGMLType::Q3_K: case GGMLType::Q4_K: return GGMLType::Q5_0;
    case GGMLType::Q5_K: return GGMLType::Q5_1;
    case GGMLType::Q6_K: return GGMLType::Q8_0;
    default: return GGMLType::F16;
  }
}

GGMLType gguf_tensor_type(const Tensor& v, GGMLType weight_type, bool keep_f32) {
  GGMLType type = v.dim() == 1 || keep_f32 ? GGMLType::F32 : weight_type;
  if (v.size(-1) % io::ggml_block_size(type) != 0) type = row_fallback(type);
  if (v.size(-1) % io::ggml_block_size(type) != 0) type = GGMLType::F16;
  return type;
}

std::vector<std::pair<std::string, GGUFValue>> arch_keys(const std::string& arch, const nlohmann::json& c,
                                                        GGMLType weight_type) {
  const int64_t hidden = c.at("hidden_size"), heads = c.at("num_attention_heads");
  const int64_t kv_heads = c.value("num_key_value_heads", heads);
  const int64_t head_dim = c.value("head_dim", int64_t{0}) > 0 ? c.value("head_dim", int64_t{0}) : hidden / heads;
  using T = GGUFType;
  auto u32 = [](int64_t v) { return GGUFValue::of(T::Uint32, v); };
  auto f32 = [](double v) { return GGUFValue::of_float(T::Float32, v); };
  const uint32_t file_type = llama_file_type(weight_type);
  std::vector<std::pair<std::string, GGUFValue>> kv = {
      {"general.architecture", GGUFValue::of_string(arch)},
      {"general.name", GGUFValue::of_string(c.value("_name_or_path", std::string("corelm")))},
      {"general.file_type", u32(file_type)},
      {arch + ".vocab_size", u32(c.at("vocab_size"))},
      {arch + ".context_length", u32(c.value("max_position_embeddings", int64_t{2048}))},
      {arch + ".embedding_length", u32(hidden)},
      {arch + ".block_count", u32(c.at("num_hidden_layers"))},
      {arch + ".feed_forward_length", u32(c.at("intermediate_size"))},
      {arch + ".attention.head_count", u32(heads)},
      {arch + ".attention.head_count_kv", u32(kv_heads)},
      {arch + ".attention.key_length", u32(head_dim)},
      {arch + ".attention.value_length", u32(head_dim)},
      {arch + ".rope.dimension_count", u32(head_dim)},
      {arch + ".rope.freq_base", f32(c.value("rope_theta", 10000.0))},
      {arch + ".attention.layer_norm_rms_epsilon", f32(c.value("rms_norm_eps", 1e-5))},
  };
  return kv;
}
}  // namespace detail

void save_gguf_model(const std::string& path, const nlohmann::json& c,
                     const std::vector<std::pair<std::string, Tensor>>& hf_tensors, GGMLType weight_type,
                     const std::vector<std::pair<std::string, GGUFValue>>& extra) {
  std::string arch = c.value("model_type", std::string("llama"));
  // Sliding-window / linear-attention layers: llama.cpp's llama would run them as full attention
  // (a different model), so such configs get corelm's own architecture.
  if (detail::has_hybrid_layers(c)) {
    const ModelConfig mc = ModelConfig::from_json(c, "save_gguf_model '" + path + "': config");
    if (!mc.all_full_attention()) return detail::save_hybrid_gguf(path, mc, c, hf_tensors, weight_type, extra);
    arch = mc.model_type;  // e.g. Mistral whose window covers the context: a plain llama
  }
  CORELM_CHECK(arch == "llama" || arch == "qwen2", ValueError, "save_gguf_model '", path, "': model_type '", arch,
               "' not supported (llama, qwen2)");
  const int64_t heads = c.at("num_attention_heads"), kv_heads = c.value("num_key_value_heads", heads);
  std::vector<std::pair<std::string, GGUFValue>> kv = detail::arch_keys(arch, c, weight_type);
  for (const auto& e : extra) kv.push_back(e);

  std::vector<GGUFWriteTensor> out;
  for (const auto& [name, t] : hf_tensors) {
    Tensor v = t;
    const bool q = name.find("self_attn.q_proj.") != std::string::npos;
    const bool k = name.find("self_attn.k_proj.") != std::string::npos;
    if (arch == "llama" && (q || k)) v = permute_rope_rows(v, q ? heads : kv_heads, /*to_interleaved=*/true);
    out.push_back({gguf_name_from_hf(name), v, detail::gguf_tensor_type(v, weight_type, false)});
  }
  io::save_gguf(path, kv, out);
}

GGUFModel load_gguf_model(const std::string& path) {
  GGUFFile f = GGUFFile::open(path);
  const std::string w = "GGUF '" + path + "': ";
  const GGUFValue* a = f.find("general.architecture");
  CORELM_CHECK(a, FormatError, w, "missing general.architecture");
  const std::string arch = a->as_string();  // a FormatError naming file, key and type otherwise
  const bool hybrid = arch == kHybridGGUFArch;
  CORELM_CHECK(arch == "llama" || arch == "qwen2" || hybrid, FormatError, w, "architecture '",
               escape_invalid_utf8(arch), "' not supported (llama, qwen2, ", kHybridGGUFArch, ")");
  auto num = [&](const std::string& key) -> const GGUFValue* {
    const GGUFValue* v = f.find(arch + "." + key);
    CORELM_CHECK(!v || v->type != GGUFType::String, FormatError, w, "metadata '", arch, ".", key,
                 "' is string, expected a number");
    return v;
  };
  auto need = [&](const std::string& key) {
    const GGUFValue* v = num(key);
    CORELM_CHECK(v != nullptr, FormatError, w, "missing key ", arch, ".", key);
    const double d = v->as_float();
    // Sizes become int64 (and tensor shapes): refuse NaN, negatives and absurd values up front.
    CORELM_CHECK(d >= 0 && d <= 2147483647.0, FormatError, w, "key ", arch, ".", key, " = ", d, " is out of range");
    return d;
  };
  // A size written as a float must still be a whole number: 1.5 layers is not 1 layer.
  auto need_size = [&](const std::string& key) {
    const double d = need(key);
    CORELM_CHECK(d == std::floor(d), FormatError, w, "key ", arch, ".", key, " = ", d, " is not a whole number");
    return static_cast<int64_t>(d);
  };
  const auto hidden = need_size("embedding_length");
  const auto layers = need_size("block_count");
  const auto ffn = need_size("feed_forward_length");
  const auto heads = need_size("attention.head_count");
  const auto kv_heads = num("attention.head_count_kv") ? need_size("attention.head_count_kv") : heads;
  CORELM_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, FormatError, w, "head counts ", heads, "/",
               kv_heads, " do not form whole KV groups");
  const auto head_dim = num("attention.key_length") ? need_size("attention.key_length") : hidden / heads;
  CORELM_CHECK(head_dim > 0 && head_dim % 2 == 0, FormatError, w, "head size ", head_dim, " is not even");
  CORELM_CHECK(f.find(arch + ".rope.scaling.type") == nullptr, FormatError, w, "rope scaling is not supported");

  GGUFModel m;
  std::map<std::string, Tensor> by_name;
  for (const auto& info : f.tensors()) {
    std::string hf;
    try {
      hf = hf_name_from_gguf(info.name);
    } catch (const ValueError&) {
      if (info.name == "rope_freqs.weight") continue;  // precomputed RoPE table llama.cpp may add
      throw FormatError(w + "tensor '" + escape_invalid_utf8(info.name) + "' is not a Llama/Qwen2" +
                        (hybrid ? "/corelm_hybrid" : "") + " tensor");
    }
    by_name[hf] = f.get(info.name).to(DType::F32);
  }
  const GGUFValue* vocab_key = num("vocab_size");
  const GGUFValue* tokens = f.find("tokenizer.ggml.tokens");
  auto emb = by_name.find("model.embed_tokens.weight");
  CORELM_CHECK(emb != by_name.end(), FormatError, w, "missing tensor 'token_embd.weight'");
  const int64_t vocab = vocab_key ? vocab_key->as_int()
                        : tokens  ? static_cast<int64_t>(tokens->array.size())
                                  : emb->second.size(0);
  const bool tied = by_name.count("lm_head.weight") == 0;
  const bool bias = by_name.count("model.layers.0.self_attn.q_proj.bias") != 0;

  auto opt_float = [&](const std::string& key, double dflt) { return num(key) ? need(key) : dflt; };
  m.config = {{"architectures", {arch == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
              {"model_type", hybrid ? "llama" : arch},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"intermediate_size", ffn},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv_heads},
              {"head_dim", head_dim},
              {"max_position_embeddings", static_cast<int64_t>(opt_float("context_length", 2048))},
              {"rms_norm_eps", opt_float("attention.layer_norm_rms_epsilon", 1e-5)},
              {"rope_theta", opt_float("rope.freq_base", 10000.0)},
              {"tie_word_embeddings", tied},
              {"attention_bias", bias},
              {"torch_dtype", "float32"}};
  // Token ids are int32 everywhere downstream: a larger value is refused here, by key.
  if (const GGUFValue* b = f.find("tokenizer.ggml.bos_token_id")) m.config["bos_token_id"] = b->as_int(0, INT32_MAX);
  if (const GGUFValue* e = f.find("tokenizer.ggml.eos_token_id")) m.config["eos_token_id"] = e->as_int(0, INT32_MAX);
  // corelm's keys, the layer kinds and the tensors each kind has: src/model/gguf_hybrid.cc.
  if (hybrid) return detail::load_hybrid_gguf(f, w, std::move(m.config), std::move(by_name));

  auto expect = [&](const std::string& hf, const Shape& shape) {
    auto it = by_name.find(hf);
    CORELM_CHECK(it != by_name.end(), FormatError, w, "missing tensor '", gguf_name_from_hf(hf), "'");
    // shape_str, not a Tensor of that shape: the metadata may imply terabytes.
    CORELM_CHECK(it->second.shape() == shape, FormatError, w, "tensor '", gguf_name_from_hf(hf), "' has shape ",
                 shape_str(it->second.shape()), " but the metadata implies ", shape_str(shape));
    Tensor v = it->second;
    const bool q = hf.find("self_attn.q_proj.") != std::string::npos;
    const bool k = hf.find("self_attn.k_proj.") != std::string::npos;
    if (arch == "llama" && (q || k)) v = permute_rope_rows(v, q ? heads : kv_heads, /*to_interleaved=*/false);
    m.tensors.emplace_back(hf, v);
    by_name.erase(it);
  };
  const int64_t qd = heads * head_dim, kvd = kv_heads * head_dim;
  expect("model.embed_tokens.weight", {vocab, hidden});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect(p + "input_layernorm.weight", {hidden});
    expect(p + "self_attn.q_proj.weight", {qd, hidden});
    expect(p + "self_attn.k_proj.weight", {kvd, hidden});
    expect(p + "self_attn.v_proj.weight", {kvd, hidden});
    if (bias) {
      expect(p + "self_attn.q_proj.bias", {qd});
      expect(p + "self_attn.k_proj.bias", {kvd});
      expect(p + "self_attn.v_proj.bias", {kvd});
    }
    expect(p + "self_attn.o_proj.weight", {hidden, qd});
    expect(p + "post_attention_layernorm.weight", {hidden});
    expect(p + "mlp.gate_proj.weight", {ffn, hidden});
    expect(p + "mlp.up_proj.weight", {ffn, hidden});
    expect(p + "mlp.down_proj.weight", {hidden, ffn});
  }
  expect("model.norm.weight", {hidden});
  if (!tied) expect("lm_head.weight", {vocab, hidden});
  CORELM_CHECK(by_name.empty(), FormatError, w, "unexpected tensor '", gguf_name_from_hf(by_name.begin()->first),
               "' (block_count ", layers, ")");

  return m;
}

}  // namespace corelm::model
