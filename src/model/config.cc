// ModelConfig: HF config.json <-> struct, validation, presets and parameter counts.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/safetensors.h"

namespace corelm::model {

using nlohmann::json;

namespace {

std::string type_of(const json& v) { return v.type_name(); }

struct Reader {
  const json& j;
  const std::string& source;

  std::string where(const std::string& field) const { return source + ": field '" + field + "'"; }

  bool has(const std::string& field) const { return j.contains(field) && !j.at(field).is_null(); }

  int64_t integer(const std::string& field) const {
    CORELM_CHECK(has(field), FormatError, source, ": missing required field '", field, "'");
    return integer_value(field, j.at(field));
  }
  int64_t integer_or(const std::string& field, int64_t fallback) const {
    return has(field) ? integer_value(field, j.at(field)) : fallback;
  }
  int64_t integer_value(const std::string& field, const json& v) const {
    // JSON writers sometimes emit 64.0 for an integer; accept exact integral floats.
    // The range test comes first: casting 1e30 (or NaN) to int64 is undefined, and a value past
    // int64 must not wrap into a plausible one.
    if (v.is_number_float()) {
      double d = v.get<double>();
      CORELM_CHECK(std::isfinite(d) && std::fabs(d) < 0x1p62, FormatError, where(field), " = ", v.dump(),
                   " is out of range");
      CORELM_CHECK(d == std::trunc(d), FormatError, where(field), " must be an integer, got ", v.dump());
      return static_cast<int64_t>(d);
    }
    CORELM_CHECK(v.is_number_integer(), FormatError, where(field), " must be an integer, got ", type_of(v), " ",
                 v.dump());
    CORELM_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() < (uint64_t{1} << 62), FormatError, where(field),
                 " = ", v.dump(), " is out of range");
    return v.get<int64_t>();
  }
  double number_or(const std::string& field, double fallback) const {
    if (!has(field)) return fallback;
    const json& v = j.at(field);
    CORELM_CHECK(v.is_number(), FormatError, where(field), " must be a number, got ", type_of(v), " ", v.dump());
    return v.get<double>();
  }
  bool boolean_or(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    const json& v = j.at(field);
    CORELM_CHECK(v.is_boolean(), FormatError, where(field), " must be true or false, got ", type_of(v), " ",
                 v.dump());
    return v.get<bool>();
  }
  std::string string_or(const std::string& field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    const json& v = j.at(field);
    CORELM_CHECK(v.is_string(), FormatError, where(field), " must be a string, got ", type_of(v), " ", v.dump());
    return v.get<std::string>();
  }
  // bos/eos ids: an integer, null, or (Llama 3 style) a list whose first entry is used; every
  // listed id must be a token of the vocabulary (the generator compares them with 32-bit ids).
  int64_t token_id(const std::string& field, int64_t vocab_size) const {
    if (!has(field)) return -1;
    const json& v = j.at(field);
    std::vector<int64_t> ids;
    if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) ids.push_back(integer_value(field + "[" + std::to_string(i) + "]", v[i]));
    } else {
      ids.push_back(integer_value(field, v));
    }
    for (int64_t id : ids)
      CORELM_CHECK(id >= 0 && id < vocab_size, FormatError, where(field), " = ", id,
                   " is not a token id of the vocabulary (0..", vocab_size - 1, ")");
    return ids.empty() ? -1 : ids.front();
  }
};

// The classification head's fields. Only a "...ForSequenceClassification" architecture has a
// head: HF writes a default id2label ({"0": "LABEL_0", "1": "LABEL_1"}) into every config.json.
void read_classifier(const json& j, const Reader& r, ModelConfig& c) {
  const bool head = j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
                    j["architectures"][0].is_string() &&
                    j["architectures"][0].get<std::string>().ends_with("ForSequenceClassification");
  if (!head) return;
  CORELM_CHECK(r.has("id2label") && j["id2label"].is_object(), FormatError, r.where("id2label"),
               " must be an object {\"0\": label, ...} for a sequence-classification model");
  const json& m = j["id2label"];
  const int64_t n = static_cast<int64_t>(m.size());
  CORELM_CHECK(n >= 1 && n <= 65536, FormatError, r.where("id2label"), " holds ", n, " labels; need 1..65536");
  c.labels.assign(static_cast<size_t>(n), "");
  for (auto it = m.begin(); it != m.end(); ++it) {
    int64_t id = -1;
    try {
      size_t used = 0;
      id = std::stoll(it.key(), &used);
      if (used != it.key().size()) id = -1;
    } catch (const std::exception&) {
      id = -1;
    }
    CORELM_CHECK(id >= 0 && id < n, FormatError, r.where("id2label"), ": key '", it.key(),
                 "' is not a label id 0..", n - 1);
    CORELM_CHECK(it.value().is_string() && !it.value().get<std::string>().empty(), FormatError,
                 r.where("id2label"), "[\"", it.key(), "\"] must be a non-empty string");
    c.labels[static_cast<size_t>(id)] = it.value().get<std::string>();
  }
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = a + 1; b < n; ++b)
      CORELM_CHECK(c.labels[a] != c.labels[b], FormatError, r.where("id2label"), ": label '", c.labels[a],
                   "' appears twice");
  CORELM_CHECK(r.integer_or("num_labels", n) == n, FormatError, r.where("num_labels"), " = ",
               r.integer("num_labels"), " but id2label holds ", n, " labels");
  if (r.has("label2id")) {
    const json& l2i = j["label2id"];
    CORELM_CHECK(l2i.is_object() && static_cast<int64_t>(l2i.size()) == n, FormatError, r.where("label2id"),
                 " must map each of the ", n, " labels of id2label to its id");
    for (int64_t id = 0; id < n; ++id) {
      const std::string& name = c.labels[static_cast<size_t>(id)];
      CORELM_CHECK(l2i.contains(name) && l2i[name].is_number_integer() && l2i[name].get<int64_t>() == id,
                   FormatError, r.where("label2id"), ": '", name, "' must map to ", id, " as in id2label");
    }
  }
  c.classifier_temperature = r.number_or("classifier_temperature", 1.0);
  c.classifier_pooling = r.string_or("classifier_pooling", "last");
  c.classifier_template = r.string_or("classifier_template", "");
}

// Per-layer specs from HF's spellings (see ModelConfig::layers). A config whose layers are all
// full attention keeps `layers` empty, so it compares equal to the plain Llama/Qwen2 config.
void read_layer_specs(const json& j, const Reader& r, ModelConfig& c, bool mistral) {
  const int64_t n = c.num_hidden_layers;
  std::vector<AttentionKind> kinds;
  if (r.has("layer_types")) {
    const json& v = j.at("layer_types");
    CORELM_CHECK(v.is_array(), FormatError, r.where("layer_types"), " must be a list of strings, got ", type_of(v));
    CORELM_CHECK(static_cast<int64_t>(v.size()) == n, FormatError, r.where("layer_types"), " lists ", v.size(),
                 " layers but num_hidden_layers is ", n);
    for (size_t l = 0; l < v.size(); ++l) {
      CORELM_CHECK(v[l].is_string(), FormatError, r.where("layer_types"), "[", l, "] must be a string, got ",
                   v[l].dump());
      try {
        kinds.push_back(parse_attention_kind(v[l].get<std::string>()));
      } catch (const ValueError& e) {
        throw FormatError(r.where("layer_types") + "[" + std::to_string(l) + "]: " + e.what());
      }
    }
  } else if (c.model_type == "qwen2" && r.boolean_or("use_sliding_window", false)) {
    // Current transformers: layers from max_window_layers on use the window (4.40's flash path
    // applied it below max_window_layers instead; layer_types, when present, settles it).
    const int64_t first = r.integer_or("max_window_layers", n);
    for (int64_t l = 0; l < n; ++l) kinds.push_back(l >= first ? AttentionKind::Sliding : AttentionKind::Full);
  } else if (mistral && r.has("sliding_window")) {
    kinds.assign(static_cast<size_t>(n), AttentionKind::Sliding);
  }
  const bool any_sliding = std::find(kinds.begin(), kinds.end(), AttentionKind::Sliding) != kinds.end();
  const bool any_linear = std::find(kinds.begin(), kinds.end(), AttentionKind::Linear) != kinds.end();
  if (!any_sliding && !any_linear) return;
  const int64_t window = any_sliding ? r.integer("sliding_window") : 0;
  const int64_t d_state = any_linear ? r.integer("linear_attention_state_size") : 0;
  CORELM_CHECK(!any_sliding || window > 0, FormatError, r.where("sliding_window"), " must be positive, got ", window);
  CORELM_CHECK(!any_linear || d_state > 0, FormatError, r.where("linear_attention_state_size"),
               " must be positive, got ", d_state);
  for (AttentionKind k : kinds) {
    LayerSpec s;
    s.attention = k;
    if (k == AttentionKind::Sliding) s.window = window;
    if (k == AttentionKind::Linear) s.d_state = d_state;
    c.layers.push_back(s);
  }
}

}  // namespace

const char* attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::Sliding: return "sliding_attention";
    case AttentionKind::Linear: return "linear_attention";
    case AttentionKind::Full: break;
  }
  return "full_attention";
}

AttentionKind parse_attention_kind(const std::string& s) {
  if (s == "full_attention") return AttentionKind::Full;
  if (s == "sliding_attention") return AttentionKind::Sliding;
  if (s == "linear_attention") return AttentionKind::Linear;
  throw ValueError("unknown layer type '" + s + "' (use full_attention, sliding_attention or linear_attention)");
}

LayerSpec ModelConfig::layer(int64_t l) const {
  CORELM_CHECK(l >= 0 && l < num_hidden_layers, IndexError, "model config: layer ", l, " out of range (",
               num_hidden_layers, " layers)");
  return layers.empty() ? LayerSpec{} : layers[static_cast<size_t>(l)];
}

bool ModelConfig::all_full_attention() const {
  for (const LayerSpec& s : layers)
    if (s.attention != AttentionKind::Full || s.ffn != FfnKind::Dense) return false;
  return true;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  CORELM_CHECK(j.is_object(), FormatError, source, ": a model config must be a JSON object, got ", j.type_name());
  Reader r{j, source};
  ModelConfig c;
  std::string type = r.string_or("model_type", "");
  if (type.empty() && j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    std::string arch = j["architectures"][0].get<std::string>();
    if (arch.rfind("Qwen2", 0) == 0) type = "qwen2";
    if (arch.rfind("Llama", 0) == 0) type = "llama";
    if (arch.rfind("Mistral", 0) == 0) type = "mistral";
    if (arch.rfind("CorelmHybrid", 0) == 0) type = "corelm_hybrid";
  }
  CORELM_CHECK(!type.empty(), FormatError, source, ": missing required field 'model_type' (\"llama\" or \"qwen2\")");
  // Mistral is a Llama without biases whose layers all slide (sliding_window; null: none).
  const bool mistral = type == "mistral";
  if (mistral) type = "llama";
  // corelm's hybrid (docs/HYBRID.md) is a Llama whose layers pick their kind from layer_types; it
  // is named apart only so that transformers refuses it instead of running a plain Llama.
  if (type == "corelm_hybrid") type = "llama";
  CORELM_CHECK(type == "llama" || type == "qwen2", FormatError, source, ": field 'model_type' is '", type,
               "'; supported: llama, mistral, qwen2");
  c.model_type = type;

  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  // HF defaults for the optional fields.
  c.num_key_value_heads = r.integer_or("num_key_value_heads", c.num_attention_heads);
  c.head_dim = r.integer_or("head_dim", 0);
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", type == "qwen2" ? 32768 : 2048);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.attention_bias = type == "qwen2" ? true : r.boolean_or("attention_bias", false);
  c.torch_dtype = r.string_or("torch_dtype", "float32");
  c.initializer_range = r.number_or("initializer_range", 0.02);
  // Sizes are bounded before anything derived from them (head_dim, the ids below) is computed.
  try {
    c.validate_sizes();
  } catch (const ValueError& e) {
    throw ValueError(source + ": " + e.what());
  }
  c.bos_token_id = r.token_id("bos_token_id", c.vocab_size);
  c.eos_token_id = r.token_id("eos_token_id", c.vocab_size);
  // Lenient: published configs carry pad ids of -1 or past the vocabulary; only a real token is kept.
  if (r.has("pad_token_id") && j["pad_token_id"].is_number_integer()) {
    const int64_t pad = j["pad_token_id"].get<int64_t>();
    if (pad >= 0 && pad < c.vocab_size) c.pad_token_id = pad;
  }
  read_classifier(j, r, c);
  read_layer_specs(j, r, c, mistral);
  c.bos_isolation = r.boolean_or("bos_isolation", false);

  // Features the decoder does not implement: refuse rather than silently compute something else.
  std::string act = r.string_or("hidden_act", "silu");
  CORELM_CHECK(act == "silu", FormatError, source, ": field 'hidden_act' is '", act, "'; only silu is supported");
  CORELM_CHECK(!r.has("rope_scaling"), FormatError, source,
               ": field 'rope_scaling' is not supported (only plain RoPE)");
  CORELM_CHECK(!r.boolean_or("mlp_bias", false), FormatError, source, ": field 'mlp_bias' = true is not supported");
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts"})
    CORELM_CHECK(!r.has(moe) || r.integer(moe) <= 1, FormatError, source, ": field '", moe,
                 "' (mixture of experts) is not supported");

  if (c.head_dim == 0) {
    CORELM_CHECK(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0, ValueError, source,
                 ": num_attention_heads (", c.num_attention_heads, ") does not divide hidden_size (", c.hidden_size,
                 ")");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  try {
    c.validate();
  } catch (const ValueError& e) {
    throw ValueError(source + ": " + e.what());
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in, IOError, "cannot open model config '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw FormatError(path + ": not valid JSON: " + e.what());
  }
  return from_json(j, path);
}

json ModelConfig::to_json() const {
  const bool qwen = model_type == "qwen2";
  json j;
  j["architectures"] = json::array({qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"});
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["rms_norm_eps"] = rms_norm_eps;
  j["max_position_embeddings"] = max_position_embeddings;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["initializer_range"] = initializer_range;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["bos_token_id"] = bos_token_id >= 0 ? json(bos_token_id) : json(nullptr);
  j["eos_token_id"] = eos_token_id >= 0 ? json(eos_token_id) : json(nullptr);
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  if (has_classifier()) {
    j["architectures"] = json::array({qwen ? "Qwen2ForSequenceClassification" : "LlamaForSequenceClassification"});
    json id2label = json::object(), label2id = json::object();
    for (size_t i = 0; i < labels.size(); ++i) {
      id2label[std::to_string(i)] = labels[i];
      label2id[labels[i]] = static_cast<int64_t>(i);
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
    j["num_labels"] = static_cast<int64_t>(labels.size());
    j["classifier_temperature"] = classifier_temperature;
    j["classifier_pooling"] = classifier_pooling;
    j["classifier_template"] = classifier_template;
  }
  int64_t window = 0, d_state = 0, first_sliding = num_hidden_layers;
  if (!all_full_attention()) {
    json types = json::array();
    for (int64_t l = 0; l < num_hidden_layers; ++l) {
      const LayerSpec s = layer(l);
      types.push_back(attention_kind_name(s.attention));
      if (s.attention == AttentionKind::Sliding) window = s.window, first_sliding = std::min(first_sliding, l);
      if (s.attention == AttentionKind::Linear) d_state = s.d_state;
    }
    j["layer_types"] = types;
    if (window > 0) j["sliding_window"] = window;
    if (d_state > 0) j["linear_attention_state_size"] = d_state;
  }
  if (bos_isolation) j["bos_isolation"] = true;
  // Every layer sliding with no biases is exactly Mistral: say so, so that transformers applies
  // the window (LlamaForCausalLM would ignore layer_types and attend to everything).
  bool all_sliding = !layers.empty();
  for (const LayerSpec& s : layers) all_sliding = all_sliding && s.attention == AttentionKind::Sliding;
  if (!qwen && all_sliding && !attention_bias && !has_classifier()) {
    j["architectures"] = json::array({"MistralForCausalLM"});
    j["model_type"] = "mistral";
  }
  // Linear-attention layers exist nowhere else: name the architecture corelm's own, so that no
  // other library loads the checkpoint as a Llama and silently computes something else.
  if (!qwen && d_state > 0) {
    j["architectures"] = json::array({"CorelmHybridForCausalLM"});
    j["model_type"] = "corelm_hybrid";
  }
  if (qwen) {
    j["use_sliding_window"] = window > 0;
    j["sliding_window"] = window > 0 ? window : max_position_embeddings;
    j["max_window_layers"] = first_sliding;
  } else {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  return j;
}

void ModelConfig::save(const std::string& path) const { io::write_file_atomic(path, to_json().dump(2) + "\n"); }

void ModelConfig::validate_sizes() const {
  // Bounds far above every published Llama/Qwen2 model (vocabularies up to ~256K, hidden 16K,
  // FFN 53K, 126 layers, 128 heads, contexts of 10M), yet low enough that no product of them
  // overflows int64 and that a typo such as 100000 layers is refused before any allocation.
  auto in_range = [](int64_t v, const char* field, int64_t hi) {
    CORELM_CHECK(v > 0, ValueError, "model config: field '", field, "' must be positive, got ", v);
    CORELM_CHECK(v <= hi, ValueError, "model config: field '", field, "' = ", v, " is above the limit of ", hi);
  };
  in_range(vocab_size, "vocab_size", kMaxVocabSize);
  in_range(hidden_size, "hidden_size", kMaxHiddenSize);
  in_range(intermediate_size, "intermediate_size", kMaxIntermediateSize);
  in_range(num_hidden_layers, "num_hidden_layers", kMaxLayers);
  in_range(num_attention_heads, "num_attention_heads", kMaxHeads);
  in_range(num_key_value_heads, "num_key_value_heads", kMaxHeads);
  in_range(max_position_embeddings, "max_position_embeddings", kMaxPositions);
  if (head_dim != 0) in_range(head_dim, "head_dim", kMaxHeadDim);
}

void ModelConfig::validate() const {
  CORELM_CHECK(model_type == "llama" || model_type == "qwen2", ValueError, "model config: model_type '", model_type,
               "' is not supported (llama, qwen2)");
  validate_sizes();
  for (auto [id, field] : {std::pair{bos_token_id, "bos_token_id"}, std::pair{eos_token_id, "eos_token_id"}})
    CORELM_CHECK(id >= -1 && id < vocab_size, ValueError, "model config: field '", field, "' = ", id,
                 " is not a token id of the vocabulary (0..", vocab_size - 1, ")");
  if (head_dim == 0) {
    CORELM_CHECK(hidden_size % num_attention_heads == 0, ValueError, "model config: num_attention_heads (",
                 num_attention_heads, ") does not divide hidden_size (", hidden_size, ")");
  }
  const int64_t d = head_dim == 0 ? hidden_size / num_attention_heads : head_dim;
  CORELM_CHECK(d % 2 == 0, ValueError, "model config: head_dim ", d, " must be even for rotary embeddings");
  CORELM_CHECK(num_attention_heads % num_key_value_heads == 0, ValueError, "model config: num_key_value_heads (",
               num_key_value_heads, ") does not divide num_attention_heads (", num_attention_heads, ")");
  CORELM_CHECK(rope_theta > 0, ValueError, "model config: rope_theta must be positive, got ", rope_theta);
  CORELM_CHECK(rms_norm_eps > 0, ValueError, "model config: rms_norm_eps must be positive, got ", rms_norm_eps);
  CORELM_CHECK(std::isfinite(classifier_temperature) && classifier_temperature > 0, ValueError,
               "model config: field 'classifier_temperature' must be a positive number, got ", classifier_temperature);
  CORELM_CHECK(classifier_pooling == "last" || classifier_pooling == "mean", ValueError,
               "model config: field 'classifier_pooling' is '", classifier_pooling, "'; expected last or mean");
  CORELM_CHECK(pad_token_id >= -1 && pad_token_id < vocab_size, ValueError, "model config: field 'pad_token_id' = ",
               pad_token_id, " is not a token id of the vocabulary (0..", vocab_size - 1, ")");
  CORELM_CHECK(layers.empty() || static_cast<int64_t>(layers.size()) == num_hidden_layers, ValueError,
               "model config: ", layers.size(), " layer specs for ", num_hidden_layers, " layers");
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerSpec& s = layers[l];
    const bool sliding = s.attention == AttentionKind::Sliding, linear = s.attention == AttentionKind::Linear;
    CORELM_CHECK(sliding ? s.window > 0 && s.window <= kMaxPositions : s.window == 0, ValueError,
                 "model config: layer ", l, " (", attention_kind_name(s.attention), ") has window ", s.window,
                 sliding ? "; a sliding layer needs 1.." + std::to_string(kMaxPositions) : "; only sliding layers have one");
    CORELM_CHECK(linear ? s.d_state > 0 && s.d_state <= kMaxHeadDim : s.d_state == 0, ValueError,
                 "model config: layer ", l, " (", attention_kind_name(s.attention), ") has d_state ", s.d_state,
                 linear ? "; a linear layer needs 1.." + std::to_string(kMaxHeadDim) : "; only linear layers have one");
  }
  CORELM_CHECK(!bos_isolation || bos_token_id >= 0, ValueError,
               "model config: bos_isolation needs a bos_token_id (documents are split at BOS)");
  CORELM_CHECK(model_type != "qwen2" || attention_bias, ValueError,
               "model config: qwen2 models have q/k/v biases (attention_bias must be true)");
}

int64_t ModelConfig::num_parameters(bool include_embeddings) const {
  const int64_t d = head_dim == 0 ? hidden_size / num_attention_heads : head_dim;
  const int64_t q = num_attention_heads * d, kv = num_key_value_heads * d;
  int64_t attn = hidden_size * q + 2 * hidden_size * kv + q * hidden_size;
  if (attention_bias) attn += q + 2 * kv + (model_type == "llama" ? hidden_size : 0);
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  int64_t n = hidden_size;  // the final norm
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    const LayerSpec s = layer(l);
    int64_t mixer = attn;
    if (s.attention == AttentionKind::Linear) {
      // q/k of d_state per head, v/o of head_dim, the decay [Hkv, d_state] and out_norm [head_dim]
      // (docs/HYBRID.md); no biases.
      const int64_t ds = s.d_state;
      mixer = hidden_size * (num_attention_heads * ds + num_key_value_heads * ds + kv + q) +
              num_key_value_heads * ds + d;
    }
    n += mixer + mlp + 2 * hidden_size;
  }
  if (include_embeddings) n += vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  n += static_cast<int64_t>(labels.size()) * hidden_size;
  return n;
}

std::vector<std::string> ModelConfig::preset_names() { return {"tiny", "small", "smollm2-135m", "hybrid"}; }

ModelConfig ModelConfig::preset(const std::string& name) {
  ModelConfig c;
  c.model_type = "llama";
  c.tie_word_embeddings = true;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.head_dim = 64;
  if (name == "tiny") {
    c.vocab_size = 16384;
    c.hidden_size = 256;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.intermediate_size = 640;
    c.max_position_embeddings = 512;
  } else if (name == "small") {
    c.vocab_size = 32000;
    c.hidden_size = 512;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.intermediate_size = 1536;
    c.max_position_embeddings = 1024;
  } else if (name == "smollm2-135m") {
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.intermediate_size = 1536;
    c.max_position_embeddings = 8192;
    c.rope_theta = 100000.0;
    c.initializer_range = 0.041666666666666664;
  } else if (name == "hybrid") {
    // docs/HYBRID.md: bounded-context layers for one CPU core; bos_isolation is opt-in (it needs
    // a tokenizer's BOS id, which a preset does not know).
    c.vocab_size = 16384;
    c.hidden_size = 256;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.intermediate_size = 640;
    c.max_position_embeddings = 8192;
    const LayerSpec lin{AttentionKind::Linear, 0, 32, FfnKind::Dense};
    const LayerSpec swa{AttentionKind::Sliding, 256, 0, FfnKind::Dense};
    c.layers = {lin, swa, swa, lin, swa, lin};
  } else {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw ValueError("unknown model preset '" + name + "' (available: " + names + ")");
  }
  c.validate();
  return c;
}

}  // namespace corelm::model
