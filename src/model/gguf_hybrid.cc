// corelm's hybrid (docs/HYBRID.md) as a GGUF file, general.architecture "corelm_hybrid":
// llama-style hyperparameter keys under the corelm_hybrid. prefix plus corelm's own (the kind of
// each layer, the sliding window, the linear-attention state size, bos_isolation), and the tensor
// names of the architecture name table (llama.cpp's for the shared parts, blk.N.attn_decay and
// blk.N.attn_out_norm for the linear layers' own). No other GGUF runtime implements these layers,
// so the architecture is corelm's own name: llama.cpp refuses the file instead of running a
// different model. The layout is documented in docs/INTEROP.md ("corelm_hybrid GGUF").
//
// RoPE permutation: rotary layers (full and sliding) store q/k rows in llama.cpp's interleaved
// order, as the llama writer does, so the shared tensors mean the same thing in both
// architectures; linear layers have no RoPE and their q/k (d_state features per head) are stored
// as they are.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>

#include "corelm/error.h"
#include "corelm/utf8.h"
#include "model/gguf_hybrid.h"

namespace corelm::model::detail {

using io::GGMLType;
using io::GGUFFile;
using io::GGUFType;
using io::GGUFValue;
using nlohmann::json;

namespace {
const std::string kArch = kHybridGGUFArch;
const std::string kPrefix = kArch + ".";
// corelm's own keys (after the prefix).
const char* const kLayerTypes = "layer_types";
const char* const kWindow = "attention.sliding_window";
const char* const kStateSize = "linear_attention.state_size";
const char* const kBosIsolation = "bos_isolation";

// Every corelm_hybrid.* key this reader understands: the llama-style ones arch_keys writes (and
// the reader reads before us), plus corelm's. Any other is refused: a newer writer's feature
// ignored here would silently change the model.
const std::set<std::string>& known_keys() {
  static const std::set<std::string> keys = {
      "vocab_size", "context_length", "embedding_length", "block_count", "feed_forward_length",
      "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
      "rope.dimension_count", "rope.freq_base", "attention.layer_norm_rms_epsilon",
      kLayerTypes, kWindow, kStateSize, kBosIsolation};
  return keys;
}

double shortest_float(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

// Heads of a q/k weight or bias: its rows over the head size.
Tensor rope_permuted(const Tensor& v, int64_t head_dim, bool to_interleaved) {
  return permute_rope_rows(v, v.size(0) / head_dim, to_interleaved);
}
}  // namespace

bool has_hybrid_layers(const json& c) {
  const std::string type = c.value("model_type", std::string());
  if (type == kArch || type == "mistral") return true;
  if (c.contains("layer_types") && c["layer_types"].is_array())
    for (const auto& e : c["layer_types"])
      if (!e.is_string() || e.get<std::string>() != attention_kind_name(AttentionKind::Full)) return true;
  return false;
}

void save_hybrid_gguf(const std::string& path, const ModelConfig& mc, const json& c,
                      const std::vector<std::pair<std::string, Tensor>>& hf_tensors, GGMLType weight_type,
                      const std::vector<std::pair<std::string, GGUFValue>>& extra) {
  const std::string w = "save_gguf_model '" + path + "': ";
  // qwen2's biases differ from llama's (no o_proj bias) and corelm loads no qwen2 with sliding
  // layers; the hybrid form is llama-style only.
  CORELM_CHECK(mc.model_type == "llama", ValueError, w, "a ", mc.model_type,
               " config with sliding-window or linear-attention layers has no GGUF form (", kArch,
               " is llama-style)");
  auto u32 = [](int64_t v) { return GGUFValue::of(GGUFType::Uint32, v); };
  std::vector<std::pair<std::string, GGUFValue>> kv = arch_keys(kArch, c, weight_type);
  std::vector<std::string> kinds;
  int64_t window = 0, d_state = 0;
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    const LayerSpec s = mc.layer(l);
    kinds.emplace_back(attention_kind_name(s.attention));
    // One window and one state size per model, as config.json has them.
    if (s.attention == AttentionKind::Sliding) {
      CORELM_CHECK(window == 0 || window == s.window, ValueError, w, "sliding layers with different windows (",
                   window, ", ", s.window, ") have no GGUF form");
      window = s.window;
    }
    if (s.attention == AttentionKind::Linear) {
      CORELM_CHECK(d_state == 0 || d_state == s.d_state, ValueError, w,
                   "linear layers with different state sizes have no GGUF form");
      d_state = s.d_state;
    }
  }
  kv.push_back({kPrefix + kLayerTypes, GGUFValue::of_strings(kinds)});
  if (window > 0) kv.push_back({kPrefix + kWindow, u32(window)});
  if (d_state > 0) kv.push_back({kPrefix + kStateSize, u32(d_state)});
  kv.push_back({kPrefix + kBosIsolation, GGUFValue::of(GGUFType::Bool, mc.bos_isolation ? 1 : 0)});
  bool has_bos = false, has_eos = false;
  for (const auto& e : extra) {
    has_bos = has_bos || e.first == "tokenizer.ggml.bos_token_id";
    has_eos = has_eos || e.first == "tokenizer.ggml.eos_token_id";
    kv.push_back(e);
  }
  // bos_isolation splits documents at BOS: the id must survive a file written without a
  // vocabulary (the reader takes bos/eos from these keys, as for llama files).
  if (!has_bos && mc.bos_token_id >= 0) kv.push_back({"tokenizer.ggml.bos_token_id", u32(mc.bos_token_id)});
  if (!has_eos && mc.eos_token_id >= 0) kv.push_back({"tokenizer.ggml.eos_token_id", u32(mc.eos_token_id)});

  std::vector<io::GGUFWriteTensor> out;
  for (const auto& [name, t] : hf_tensors) {
    int64_t layer = -1;
    const ParameterName* p = find_layer_parameter(name, &layer);
    Tensor v = t;
    if (p && p->rope_rows && mc.layer(layer).attention != AttentionKind::Linear)
      v = rope_permuted(v, mc.head_dim, /*to_interleaved=*/true);
    out.push_back({gguf_name_from_hf(name), v, gguf_tensor_type(v, weight_type, p && p->raw)});
  }
  io::save_gguf(path, kv, out);
}

GGUFModel load_hybrid_gguf(const GGUFFile& f, const std::string& w, json base, std::map<std::string, Tensor> by_name) {
  for (const auto& [key, value] : f.metadata())
    if (key.starts_with(kPrefix))
      CORELM_CHECK(known_keys().count(key.substr(kPrefix.size())), FormatError, w, "unknown key '",
                   escape_invalid_utf8(key), "' (not written by this corelm; see docs/INTEROP.md)");
  const int64_t layers = base.at("num_hidden_layers"), head_dim = base.at("head_dim");
  // The value size and the rotary width are the head size here: other values are other models.
  for (const char* key : {"attention.value_length", "rope.dimension_count"})
    if (const GGUFValue* v = f.find(kPrefix + key))
      CORELM_CHECK(v->as_float() == static_cast<double>(head_dim), FormatError, w, "key ", kPrefix, key, " = ",
                   v->as_float(), " differs from the head size ", head_dim);

  const GGUFValue* lt = f.find(kPrefix + kLayerTypes);
  CORELM_CHECK(lt, FormatError, w, "missing key ", kPrefix, kLayerTypes, " (the kind of each of the ", layers,
               " blocks)");
  const std::vector<std::string> kinds = lt->as_array(GGUFType::String).strings();  // names the key otherwise
  CORELM_CHECK(static_cast<int64_t>(kinds.size()) == layers, FormatError, w, "key ", kPrefix, kLayerTypes, " has ",
               kinds.size(), " entries but block_count is ", layers);
  bool sliding = false, linear = false;
  for (size_t l = 0; l < kinds.size(); ++l) {
    AttentionKind k;
    try {
      k = parse_attention_kind(kinds[l]);
    } catch (const ValueError&) {
      throw FormatError(w + "key " + kPrefix + kLayerTypes + "[" + std::to_string(l) + "] = '" +
                        escape_invalid_utf8(kinds[l]) + "' is not a layer kind (full_attention, sliding_attention, " +
                        "linear_attention)");
    }
    sliding = sliding || k == AttentionKind::Sliding;
    linear = linear || k == AttentionKind::Linear;
  }
  // A size some layer needs: present, an integer, 1..hi.
  auto size_key = [&](const char* key, bool needed, const char* who, int64_t hi) -> int64_t {
    const GGUFValue* v = f.find(kPrefix + key);
    if (!v) {
      CORELM_CHECK(!needed, FormatError, w, "missing key ", kPrefix, key, " (the model has ", who, " layers)");
      return 0;
    }
    const int64_t n = v->as_int();  // a FormatError naming the key for a non-integer
    CORELM_CHECK(n > 0 && n <= hi, FormatError, w, "key ", kPrefix, key, " = ", n, " is out of range (1..", hi, ")");
    return n;
  };
  const int64_t window = size_key(kWindow, sliding, "sliding_attention", ModelConfig::kMaxPositions);
  const int64_t d_state = size_key(kStateSize, linear, "linear_attention", ModelConfig::kMaxHeadDim);
  const GGUFValue* iso = f.find(kPrefix + kBosIsolation);
  bool bias = false;
  for (const auto& [hf, t] : by_name) bias = bias || hf.ends_with(".self_attn.q_proj.bias");

  json cfg = std::move(base);
  // Float32 keys come back as the shortest decimal of that float (1e-06, not 9.99999997e-07), so
  // config.json written from the file says what the model's config said.
  for (const auto& [field, key] : {std::pair{"rms_norm_eps", "attention.layer_norm_rms_epsilon"},
                                   std::pair{"rope_theta", "rope.freq_base"}})
    if (const GGUFValue* v = f.find(kPrefix + key); v && v->type == GGUFType::Float32)
      cfg[field] = shortest_float(static_cast<float>(v->as_float()));
  cfg["architectures"] = json::array({"CorelmHybridForCausalLM"});
  cfg["model_type"] = kArch;  // ModelConfig reads it as a llama with layer_types
  cfg["attention_bias"] = bias;
  cfg["layer_types"] = kinds;
  if (sliding) cfg["sliding_window"] = window;
  if (linear) cfg["linear_attention_state_size"] = d_state;
  cfg["bos_isolation"] = iso ? iso->as_bool() : false;
  ModelConfig mc;
  try {
    mc = ModelConfig::from_json(cfg, "GGUF '" + f.path() + "'");
  } catch (const ValueError& e) {  // e.g. bos_isolation without a bos id
    throw FormatError(e.what());
  }

  // The tensors are exactly the decoder's parameters for these layer kinds.
  auto kind_of = [&](const std::string& hf) {
    int64_t l = -1;
    return find_layer_parameter(hf, &l) && l >= 0 && l < layers
               ? std::string(" (layer ") + std::to_string(l) + " is " + kinds[static_cast<size_t>(l)] + ")"
               : std::string();
  };
  GGUFModel m;
  for (const auto& [hf, shape] : parameter_shapes(mc)) {
    auto it = by_name.find(hf);
    CORELM_CHECK(it != by_name.end(), FormatError, w, "missing tensor '", gguf_name_from_hf(hf), "'", kind_of(hf));
    CORELM_CHECK(it->second.shape() == shape, FormatError, w, "tensor '", gguf_name_from_hf(hf), "' has shape ",
                 shape_str(it->second.shape()), " but the metadata implies ", shape_str(shape), kind_of(hf));
    int64_t layer = -1;
    const ParameterName* p = find_layer_parameter(hf, &layer);
    Tensor v = it->second;
    if (p && p->rope_rows && mc.layer(layer).attention != AttentionKind::Linear)
      v = rope_permuted(v, mc.head_dim, /*to_interleaved=*/false);
    m.tensors.emplace_back(hf, v);
    by_name.erase(it);
  }
  CORELM_CHECK(by_name.empty(), FormatError, w, "unexpected tensor '", gguf_name_from_hf(by_name.begin()->first),
               "'", kind_of(by_name.begin()->first));
  m.config = mc.to_json();
  return m;
}

}  // namespace corelm::model::detail
