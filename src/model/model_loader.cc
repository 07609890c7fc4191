// load_model: every checkpoint form -> (HF config.json object, HF-named tensors, tokenizer) ->
// one strict (or lenient) assembly into a Decoder. See model_loader.h.
#include "corelm/model_loader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "corelm/error.h"
#include "corelm/finite.h"
#include "corelm/architecture.h"
#include "corelm/llama2c.h"
#include "corelm/safetensors.h"
#include "model/model_loader_internal.h"

namespace corelm::model {
namespace fs = std::filesystem;
using nlohmann::json;


namespace {

struct RawCheckpoint {
  std::string source;         // what tensor errors name: the index.json, the .safetensors, the .gguf, the .bin
  std::string config_source;  // what config errors name: config.json, or the .gguf / .bin holding the header
  json config;
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> file_of;  // tensor -> the shard holding it (sharded folders)
  std::vector<io::SafetensorsFile> keep_open;  // zero-copy views point into these mappings
};

// Refuses a FIFO, device or socket (reading one could block forever or never end) and files
// above `max_bytes`; returns the size.
uint64_t regular_file_size(const std::string& path, uint64_t max_bytes = ~uint64_t{0}) {
  struct stat st {};
  CORELM_CHECK(::stat(path.c_str(), &st) == 0, IOError, path, ": cannot open: ", std::strerror(errno));
  CORELM_CHECK(S_ISREG(st.st_mode), IOError, path, ": not a regular file (a FIFO, device or socket cannot be read ",
               "as a model file)");
  const auto size = static_cast<uint64_t>(st.st_size);
  CORELM_CHECK(size <= max_bytes, FormatError, path, ": ", size, " bytes is more than the ", max_bytes,
               " a file of this kind may hold");
  return size;
}

// config.json, generation_config.json, model.safetensors.index.json: a few KB to a few MB.
constexpr uint64_t kMaxJsonBytes = 64ull << 20;

json read_json(const std::string& path) {
  regular_file_size(path, kMaxJsonBytes);
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw FormatError(path + ": invalid JSON: " + e.what());
  }
}

// A special token as tokenizer_config.json writes it: a string, or an AddedToken object
// {"content": ..., ...}; "" for anything else (null, absent).
std::string special_token_text(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

// tokenizer_config.json `chat_template`: a string, or a list of {"name", "template"} of which
// transformers renders the "default" entry; a list without one takes its first entry (transformers
// would refuse to render without a template name) and says so in a warning.
std::string chat_template_field(const json& cfg, const std::string& source, std::vector<std::string>& warnings) {
  if (!cfg.is_object() || !cfg.contains("chat_template") || cfg["chat_template"].is_null()) return "";
  const json& v = cfg["chat_template"];
  if (v.is_string()) return v.get<std::string>();
  CORELM_CHECK(v.is_array(), FormatError, source, ": field 'chat_template' must be a string or a list of ",
               "{\"name\", \"template\"} objects, got ", v.type_name());
  const json* first = nullptr;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    CORELM_CHECK(e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") &&
                     e["template"].is_string(),
                 FormatError, source, ": field 'chat_template[", i, "]' must be a {\"name\": string, \"template\": string} object");
    if (e["name"] == "default") return e["template"].get<std::string>();
    if (!first) first = &e;
  }
  if (!first) return "";
  warnings.push_back(source + ": chat_template lists no \"default\" template; using the first, '" +
                     (*first)["name"].get<std::string>() + "'");
  return (*first)["template"].get<std::string>();
}

// A chat template file holds source text: a few KB, never megabytes.
constexpr uint64_t kMaxTemplateBytes = 4ull << 20;

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  regular_file_size(path, max_bytes);
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string join(const std::vector<std::string>& names, size_t limit = 12) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += ", ... (" + std::to_string(names.size() - limit) + " more)";
  return out;
}

// Refuses what the decoder does not compute, naming the field, and maps Mistral (a Llama
// without biases) onto llama when it has no effective sliding window.
void check_supported(json& c, const std::string& source) {
  CORELM_CHECK(c.is_object(), FormatError, source, ": a model config must be a JSON object");
  auto has = [&](const char* k) { return c.contains(k) && !c[k].is_null(); };
  CORELM_CHECK(!has("quantization_config"), FormatError, source,
               ": field 'quantization_config' (a quantized Hugging Face checkpoint: GPTQ/AWQ/bitsandbytes...) is not "
               "supported; use the unquantized weights");
  for (const char* mla : {"kv_lora_rank", "q_lora_rank"})
    CORELM_CHECK(!has(mla), FormatError, source, ": field '", mla,
                 "' (multi-head latent attention, MLA) is not supported");
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok"})
    CORELM_CHECK(!has(moe) || (c[moe].is_number_integer() && c[moe].get<int64_t>() <= 1), FormatError, source,
                 ": field '", moe, "' (mixture of experts) is not supported");
  const std::string type = c.value("model_type", std::string());
  if (type == "mistral") {
    const int64_t max_pos = c.value("max_position_embeddings", int64_t{32768});
    if (has("sliding_window")) {
      CORELM_CHECK(c["sliding_window"].is_number_integer(), FormatError, source,
                   ": field 'sliding_window' must be an integer or null");
      // A real window stays Mistral: ModelConfig::from_json makes every layer a sliding layer.
      if (c["sliding_window"].get<int64_t>() < max_pos) return;
    }
    c["model_type"] = "llama";
    c["architectures"] = json::array({"LlamaForCausalLM"});
  }
  if (type == "qwen2" && c.value("use_sliding_window", false)) {
    const int64_t max_pos = c.value("max_position_embeddings", int64_t{32768});
    const int64_t window = has("sliding_window") && c["sliding_window"].is_number_integer()
                               ? c["sliding_window"].get<int64_t>() : 0;
    CORELM_CHECK(window >= max_pos, FormatError, source,
                 ": field 'use_sliding_window' = true (sliding-window attention) is not supported");
    c["use_sliding_window"] = false;  // the window covers every position: plain causal attention
  }
}

// model.safetensors.index.json: every weight_map entry names a shard file in the folder, every
// tensor is in the shard it is mapped to, and no tensor is stored in two shards.
void read_sharded(const fs::path& dir, RawCheckpoint& raw) {
  const std::string index_path = (dir / "model.safetensors.index.json").string();
  raw.source = index_path;
  json index = read_json(index_path);
  CORELM_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), FormatError,
               index_path, ": missing object field 'weight_map'");
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensors mapped to it
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    CORELM_CHECK(it.value().is_string(), FormatError, index_path, ": weight_map['", it.key(),
                 "'] must be a file name string");
    const std::string shard = it.value().get<std::string>();
    CORELM_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos &&
                     shard != "." && shard != "..",
                 FormatError, index_path, ": weight_map['", it.key(), "'] = '", shard,
                 "' is not a file name inside the checkpoint folder");
    by_shard[shard].push_back(it.key());
  }
  CORELM_CHECK(!by_shard.empty(), FormatError, index_path, ": weight_map is empty");
  std::map<std::string, std::string> found_in;  // tensor -> shard holding it
  for (const auto& [shard, names] : by_shard) {
    const fs::path shard_path = dir / shard;
    CORELM_CHECK(fs::exists(shard_path), IOError, index_path, ": shard '", shard, "' (holding '", names.front(),
                 "') does not exist");
    raw.keep_open.push_back(io::SafetensorsFile::open(shard_path.string()));
    const io::SafetensorsFile& f = raw.keep_open.back();
    for (const std::string& n : f.names()) {
      auto [it, fresh] = found_in.emplace(n, shard);
      CORELM_CHECK(fresh, FormatError, index_path, ": tensor '", n, "' is stored in two shards ('", it->second,
                   "' and '", shard, "')");
    }
    for (const std::string& n : names) {
      CORELM_CHECK(f.contains(n), FormatError, index_path, ": tensor '", n, "' is mapped to shard '", shard,
                   "', which does not hold it");
      raw.tensors.emplace_back(n, f.get(n));
      raw.file_of[n] = shard_path.string();
    }
  }
  // Tensors present in a shard but absent from weight_map: transformers ignores them, and so
  // do we, except that strict mode reports them as unexpected.
  for (const auto& [name, shard] : found_in)
    if (!index["weight_map"].contains(name))
      for (const auto& f : raw.keep_open)
        if (fs::path(f.path()).filename() == shard) raw.tensors.emplace_back(name, f.get(name));
}

void read_safetensors(const std::string& path, RawCheckpoint& raw) {
  raw.source = path;
  raw.keep_open.push_back(io::SafetensorsFile::open(path));
  for (const std::string& n : raw.keep_open.back().names()) raw.tensors.emplace_back(n, raw.keep_open.back().get(n));
}

// A token id field (an integer, null, or a list of integers) of `source`: each entry a whole
// number in [0, 2^31) -- checked before any narrowing, so 1e12 is an error naming the key, not
// a wrapped id. The vocabulary bound is checked once the config is known (check_id_range).
std::vector<int64_t> id_list(const json& v, const std::string& source, const std::string& key) {
  std::vector<int64_t> out;
  auto one = [&](const json& e, const std::string& where) {
    bool whole = e.is_number_integer();
    double d = whole ? 0.0 : e.is_number_float() ? e.get<double>() : -1.0;
    if (!whole && e.is_number_float() && std::isfinite(d) && d == std::trunc(d) && d >= 0 && d < 2147483648.0) whole = true;
    CORELM_CHECK(whole, FormatError, source, ": field '", where, "' must be a token id (an integer), got ", e.dump());
    const bool in_range = e.is_number_float() ? true
                          : e.is_number_unsigned() ? e.get<uint64_t>() < (uint64_t{1} << 31)
                                                   : e.get<int64_t>() >= 0 && e.get<int64_t>() < (int64_t{1} << 31);
    CORELM_CHECK(in_range, FormatError, source, ": field '", where, "' = ", e.dump(), " is not a token id (0..2147483647)");
    out.push_back(e.is_number_float() ? static_cast<int64_t>(d) : e.get<int64_t>());
  };
  if (v.is_null()) return out;
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) one(v[i], key + "[" + std::to_string(i) + "]");
  } else {
    one(v, key);
  }
  return out;
}

void check_id_range(const std::vector<int64_t>& ids, int64_t vocab_size, const std::string& source,
                    const std::string& key) {
  for (int64_t id : ids)
    CORELM_CHECK(id >= 0 && id < vocab_size, FormatError, source, ": field '", key, "' = ", id,
                 " is not a token id of the model's vocabulary (0..", vocab_size - 1, ")");
}

std::vector<io::GGUFValue> string_values(const std::vector<std::string>& v) {
  std::vector<io::GGUFValue> out;
  for (const auto& s : v) out.push_back(io::GGUFValue::of_string(s));
  return out;
}

// tokenizer.ggml.* metadata (the BPE form) from a byte-level BPE file, for later GGUF writes.
std::vector<std::pair<std::string, io::GGUFValue>> bpe_gguf_metadata(const std::string& path, int64_t vocab_size) {
  using T = io::GGUFType;
  GgufBpeVocab v = gguf_bpe_vocab_from_file(path, static_cast<size_t>(vocab_size));
  std::vector<io::GGUFValue> types;
  for (int32_t t : v.token_types) types.push_back(io::GGUFValue::of(T::Int32, t));
  std::vector<std::pair<std::string, io::GGUFValue>> kv = {
      {"tokenizer.ggml.model", io::GGUFValue::of_string("gpt2")},
      {"tokenizer.ggml.pre", io::GGUFValue::of_string(v.pre)},
      {"tokenizer.ggml.tokens", io::GGUFValue::of_array(T::String, string_values(v.tokens))},
      {"tokenizer.ggml.token_type", io::GGUFValue::of_array(T::Int32, std::move(types))},
      {"tokenizer.ggml.merges", io::GGUFValue::of_array(T::String, string_values(v.merges))}};
  if (v.bos) kv.push_back({"tokenizer.ggml.bos_token_id", io::GGUFValue::of(T::Uint32, *v.bos)});
  if (v.eos) kv.push_back({"tokenizer.ggml.eos_token_id", io::GGUFValue::of(T::Uint32, *v.eos)});
  if (v.unk) kv.push_back({"tokenizer.ggml.unknown_token_id", io::GGUFValue::of(T::Uint32, *v.unk)});
  if (v.pad) kv.push_back({"tokenizer.ggml.padding_token_id", io::GGUFValue::of(T::Uint32, *v.pad)});
  kv.push_back({"tokenizer.ggml.add_bos_token", io::GGUFValue::of(T::Bool, v.add_bos)});
  kv.push_back({"tokenizer.ggml.add_eos_token", io::GGUFValue::of(T::Bool, v.add_eos)});
  // llama.cpp has no normalizer or ignore_merges keys; corelm keeps them under its own prefix.
  kv.push_back({"corelm.tokenizer.nfc", io::GGUFValue::of(T::Bool, v.nfc)});
  kv.push_back({"corelm.tokenizer.ignore_merges", io::GGUFValue::of(T::Bool, v.ignore_merges)});
  return kv;
}

// The tokenizer a GGUF file describes in its metadata, or nullptr when it has none.
std::unique_ptr<Tokenizer> gguf_tokenizer(const io::GGUFFile& f, TokenizerSource& src) {
  const io::GGUFValue* model = f.find("tokenizer.ggml.model");
  if (model == nullptr) return nullptr;
  const std::string& kind = model->as_string();
  const std::string w = "GGUF '" + f.path() + "'";
  const io::GGUFValue* tokens = f.find("tokenizer.ggml.tokens");
  CORELM_CHECK(tokens, FormatError, w, ": tokenizer.ggml.tokens missing");
  src.kind = "gguf";
  src.path = f.path();
  for (const auto& [k, v] : f.metadata())
    if (k.starts_with("tokenizer.ggml.") || k.starts_with("corelm.tokenizer.")) src.gguf_metadata.emplace_back(k, v);
  // The typed accessors name the file and key (and expected vs actual type) on a mismatch.
  std::vector<std::string> pieces = tokens->as_array(io::GGUFType::String).strings();
  const auto n_pieces = static_cast<int64_t>(pieces.size());  // pieces is moved below
  auto id_of = [&](const char* key) -> std::optional<TokenId> {
    const io::GGUFValue* v = f.find(key);
    if (!v) return std::nullopt;
    const int64_t id = v->as_int();
    // Checked before narrowing to a 32-bit id. Some converters write a padding id past the
    // vocabulary; it pads nothing, so it is dropped, but a bos/eos outside it is an error.
    if ((id < 0 || id >= n_pieces) && std::string_view(key) == "tokenizer.ggml.padding_token_id") return std::nullopt;
    CORELM_CHECK(id >= 0 && id < n_pieces, FormatError, w, ": ", key, " = ", id,
                 " is not a token id of its vocabulary (0..", n_pieces - 1, ")");
    return static_cast<TokenId>(id);
  };
  auto flag = [&](const char* key, bool dflt) {
    const io::GGUFValue* v = f.find(key);
    return v ? v->as_bool() : dflt;
  };
  if (kind == "gpt2") {
    GgufBpeVocab v;
    v.tokens = std::move(pieces);
    if (const io::GGUFValue* types = f.find("tokenizer.ggml.token_type"))
      for (int64_t t : types->as_array(io::GGUFType::Int32).ints()) v.token_types.push_back(static_cast<int32_t>(t));
    if (const io::GGUFValue* merges = f.find("tokenizer.ggml.merges"))
      v.merges = merges->as_array(io::GGUFType::String).strings();
    if (const io::GGUFValue* pre = f.find("tokenizer.ggml.pre")) v.pre = pre->as_string();
    v.nfc = flag("corelm.tokenizer.nfc", v.pre == "qwen2");  // HF's Qwen2 tokenizer normalizes to NFC
    v.ignore_merges = flag("corelm.tokenizer.ignore_merges", v.pre == "llama-bpe");
    v.bos = id_of("tokenizer.ggml.bos_token_id");
    v.eos = id_of("tokenizer.ggml.eos_token_id");
    v.pad = id_of("tokenizer.ggml.padding_token_id");
    v.add_bos = flag("tokenizer.ggml.add_bos_token", false);
    v.add_eos = flag("tokenizer.ggml.add_eos_token", false);
    return tokenizer_from_gguf_bpe(v, f.path());
  }
  if (kind == "llama") {
    std::vector<float> scores;
    if (const io::GGUFValue* s = f.find("tokenizer.ggml.scores"))
      for (double e : s->as_array().floats()) scores.push_back(static_cast<float>(e));
    return detail::make_llama2c_tokenizer(io::Llama2cTokenizer::from_gguf_pieces(pieces, scores, w), f.path());
  }
  throw FormatError(w + ": tokenizer.ggml.model '" + kind +
                    "' is not supported (gpt2 = byte-level BPE, llama = SentencePiece BPE); pass --tokenizer PATH");
}

void round_to(const std::string& dtype, Tensor& t) {
  if (dtype == "bf16") t = t.to(DType::BF16).to(DType::F32);
  if (dtype == "f16") t = t.to(DType::F16).to(DType::F32);
}

// The config fields a dimension of a parameter's shape comes from, for mismatch errors.
std::string fields_giving(const ModelConfig& c, int64_t dim) {
  std::string out;
  auto add = [&](bool match, const std::string& what, int64_t v) {
    if (match) out += (out.empty() ? "" : " or ") + what + " = " + std::to_string(v);
  };
  add(dim == c.vocab_size, "'vocab_size'", c.vocab_size);
  add(dim == c.hidden_size, "'hidden_size'", c.hidden_size);
  add(dim == c.intermediate_size, "'intermediate_size'", c.intermediate_size);
  add(dim == c.q_dim(), "'num_attention_heads' x 'head_dim'", c.q_dim());
  add(dim == c.kv_dim() && c.kv_dim() != c.q_dim(), "'num_key_value_heads' x 'head_dim'", c.kv_dim());
  return out;
}

// Layer index of "model.layers.N.<...>", or -1.
int64_t layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (!name.starts_with(prefix)) return -1;
  int64_t n = 0;
  size_t i = prefix.size();
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    n = n * 10 + (name[i] - '0');
    if (n > (int64_t{1} << 40)) return -1;
  }
  return i < name.size() && name[i] == '.' ? n : -1;
}

std::string element_str(const Shape& shape, size_t flat) {
  std::vector<int64_t> idx(shape.size());
  auto rest = static_cast<int64_t>(flat);
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? rest % shape[d] : 0;
    rest = shape[d] ? rest / shape[d] : 0;
  }
  std::string out = "[";
  for (size_t d = 0; d < idx.size(); ++d) out += (d ? ", " : "") + std::to_string(idx[d]);
  return out + "]";
}

// The config checked against the file's tensors -- names, layer count and every shape -- before
// the decoder allocates a byte: a config.json that says 100000 layers or a 16M vocabulary over
// a 1 MB file is an error naming the field, not gigabytes of zeros.
std::map<std::string, const Tensor*> match_tensors(const ModelConfig& config, const RawCheckpoint& raw,
                                                   const LoadOptions& o, std::vector<std::string>& warnings) {
  const auto expected = parameter_shapes(config);
  std::map<std::string, const Shape*> want;
  for (const auto& [name, shape] : expected) want[name] = &shape;
  int64_t file_layers = 0;
  for (const auto& [name, t] : raw.tensors) file_layers = std::max(file_layers, layer_of(name) + 1);
  // In both modes: --no-strict tolerates a missing tensor, not layers the file never had (their
  // initialisation would be all the model there is, at whatever size the config asks).
  CORELM_CHECK(file_layers == config.num_hidden_layers, FormatError, raw.config_source, ": field 'num_hidden_layers' = ",
               config.num_hidden_layers, ", but ", raw.source,
               file_layers == 0 ? std::string(" holds no model.layers.* tensors")
                                : " holds " + std::to_string(file_layers) + " layers (model.layers.0 .. model.layers." +
                                      std::to_string(file_layers - 1) + ")");

  std::map<std::string, const Tensor*> given;
  std::vector<std::string> unexpected, missing;
  for (const auto& [name, t] : raw.tensors) {
    if (name.ends_with("rotary_emb.inv_freq")) continue;  // HF's RoPE buffer, recomputed
    if (want.count(name)) given[name] = &t;
    else if (!(name == "lm_head.weight" && config.tie_word_embeddings)) unexpected.push_back(name);
  }
  for (const auto& [name, shape] : expected)
    if (!given.count(name)) missing.push_back(name);
  if (!missing.empty() || !unexpected.empty()) {
    std::string what;
    if (!missing.empty()) what += "missing tensors: " + join(missing);
    if (!unexpected.empty()) what += std::string(what.empty() ? "" : "; ") + "unexpected: " + join(unexpected);
    CORELM_CHECK(!o.strict, FormatError, raw.source, ": ", what, " (strict mode; --no-strict loads anyway)");
    warnings.push_back(raw.source + ": " + what + " (non-strict: missing keep their initialisation, unexpected are ignored)");
  }
  for (const auto& [name, t] : given) {
    const Shape& need = *want.at(name);
    if (t->shape() == need) continue;
    std::string because;
    for (size_t d = 0; d < need.size(); ++d)
      if (d >= t->shape().size() || t->shape()[d] != need[d]) {
        because = fields_giving(config, need[d]);
        break;
      }
    auto file = raw.file_of.find(name);
    const std::string weights = file == raw.file_of.end() ? raw.source : file->second;
    // When a config field explains the difference the config is the likelier culprit (the
    // weights' shapes agree with each other): the error leads with it.
    if (!because.empty() && raw.config_source != weights)
      throw FormatError(raw.config_source + ": field " + because + " does not fit the weights: " + weights +
                        " holds tensor '" + name + "' with shape " + shape_str(t->shape()) + ", the config needs " +
                        shape_str(need));
    throw FormatError(weights + ": tensor '" + name + "' has shape " + shape_str(t->shape()) + ", but " +
                      raw.config_source + " needs " + shape_str(need) + (because.empty() ? "" : " (" + because + ")"));
  }
  return given;
}

// Builds the decoder from a raw checkpoint: strict or lenient name matching, shapes always checked
// first, then every weight is copied in and checked to be finite.
Decoder assemble(RawCheckpoint& raw, const LoadOptions& o, std::vector<std::string>& warnings) {
  const ModelConfig config = ModelConfig::from_json(raw.config, raw.config_source);
  const std::map<std::string, const Tensor*> given = match_tensors(config, raw, o, warnings);
  Decoder decoder(config);
  if (given.size() < decoder.named_parameters().size()) decoder.init_weights(0);  // non-strict, tensors missing
  for (const auto& [name, t] : given) {
    // A NaN weight does not fail anywhere later: it generates token 0 forever, gives a null
    // perplexity, labels every record alike -- all with exit code 0. So it is refused here.
    Tensor& p = decoder.parameter(name);
    const size_t n = static_cast<size_t>(p.numel());
    size_t bad;
    if (o.dtype == "f32" && t->dtype() == DType::F32 && t->is_contiguous() && p.is_contiguous()) {
      bad = copy_checking_finite(t->data<float>(), p.data<float>(), n);  // the usual case: one pass
    } else {
      Tensor v = *t;
      round_to(o.dtype, v);
      decoder.load_parameter(name, v);
      bad = first_non_finite(p.data<float>(), n);
    }
    if (bad == n) continue;
    const float x = p.data<float>()[bad];
    auto file = raw.file_of.find(name);
    const bool by_rounding = o.dtype != "f32" && t->dtype() == DType::F32 && std::isfinite(t->contiguous().data<float>()[bad]);
    throw FormatError((file == raw.file_of.end() ? raw.source : file->second) + ": tensor '" + name + "' holds " +
                      (std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf") + " at element " + element_str(p.shape(), bad) +
                      " (flat index " + std::to_string(bad) + ")" +
                      (by_rounding ? " after rounding to " + o.dtype + " (the value is out of its range)"
                                   : "; a checkpoint with non-finite weights (e.g. saved by a diverged training run) "
                                     "cannot compute anything meaningful"));
  }
  return decoder;
}

}  // namespace


std::string detect_checkpoint_format(const std::string& path) {
  if (fs::is_directory(path)) return "model-dir";
  struct stat st {};
  CORELM_CHECK(::stat(path.c_str(), &st) == 0, IOError, path, ": cannot open (", std::strerror(errno),
               "; expected a model directory, .gguf, .safetensors or llama2.c .bin)");
  // A FIFO or device would block the open below, or feed the llama2.c reader without end.
  CORELM_CHECK(S_ISREG(st.st_mode), IOError, path, ": not a regular file (a FIFO, device or socket cannot be read ",
               "as a model; expected a model directory, .gguf, .safetensors or llama2.c .bin)");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CORELM_CHECK(fd >= 0, IOError, path, ": cannot open: ", std::strerror(errno));
  char head[9] = {};
  const ssize_t got = ::pread(fd, head, sizeof head, 0);
  ::close(fd);
  const std::string ext = fs::path(path).extension().string();
  // The magic decides; failing that, the extension names the format whose reader then reports
  // the damage (a .safetensors with a broken header is a safetensors error, not a llama2.c one).
  if (got >= 4 && std::memcmp(head, "GGUF", 4) == 0) return "gguf";
  if (got == 9 && head[8] == '{') return "safetensors";
  if (ext == ".gguf") return "gguf";
  if (ext == ".safetensors") return "safetensors";
  CORELM_CHECK(ext != ".json", FormatError, path, ": a JSON file is not a model; give the model directory holding it");
  return "llama2c";  // no magic of its own: its header is validated when read
}

static Checkpoint load_model_unchecked(const std::string& path, const LoadOptions& o);

Checkpoint load_model(const std::string& path, const LoadOptions& o) {
  try {
    return load_model_unchecked(path, o);
  } catch (const nlohmann::json::exception& e) {  // a config/index field of the wrong JSON type
    throw FormatError(path + ": unexpected JSON value: " + e.what());
  }
}

static Checkpoint load_model_unchecked(const std::string& path, const LoadOptions& o) {
  CORELM_CHECK(o.dtype == "f32" || o.dtype == "bf16" || o.dtype == "f16", ValueError, "load_model: dtype '", o.dtype,
               "' (supported: f32, bf16, f16)");
  // Checkpoint holds a Decoder, which only exists once the config is known: gather the rest first.
  struct {
    std::string format;
    std::vector<int64_t> eos_ids;
    int64_t bos_id = -1;
    TokenizerSource tokenizer_source;
    std::string chat_template, bos_token, eos_token;
    std::vector<std::string> warnings;
  } ck;
  ck.format = detect_checkpoint_format(path);
  RawCheckpoint raw;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_dir;  // where a directory-style checkpoint looks for its tokenizer
  std::string gen_source;     // generation_config.json when there is one
  bool bos_named = false, eos_named = false;  // tokenizer_config.json names bos_token / eos_token
  int64_t vocab_size = 0;

  if (ck.format == "model-dir" || ck.format == "safetensors") {
    const fs::path dir = ck.format == "model-dir" ? fs::path(path) : fs::path(path).parent_path();
    const fs::path config_path = dir / "config.json";
    // A single file is opened first, so a damaged one is reported as such before a missing config.
    if (ck.format == "safetensors") read_safetensors(path, raw);
    CORELM_CHECK(fs::exists(config_path), IOError, config_path.string(), ": missing (a Hugging Face / corelm model ",
                 "needs config.json beside its weights)");
    raw.config = read_json(config_path.string());
    raw.config_source = config_path.string();
    try {
      check_supported(raw.config, config_path.string());
    } catch (const json::exception& e) {  // e.g. "max_position_embeddings": "big"
      throw FormatError(config_path.string() + ": unexpected JSON value: " + e.what());
    }
    if (ck.format == "safetensors") {
      // read above
    } else if (fs::exists(dir / "model.safetensors.index.json")) {
      read_sharded(dir, raw);
    } else {
      CORELM_CHECK(fs::exists(dir / "model.safetensors"), IOError, path, ": no model.safetensors or ",
                   "model.safetensors.index.json (pytorch_model.bin checkpoints are not supported: convert them to "
                   "safetensors)");
      read_safetensors((dir / "model.safetensors").string(), raw);
    }
    const fs::path gen = dir / "generation_config.json";
    if (fs::exists(gen)) {
      gen_source = gen.string();
      json g = read_json(gen.string());
      if (g.is_object() && g.contains("eos_token_id")) {
        ck.eos_ids = id_list(g["eos_token_id"], gen_source, "eos_token_id");
        // The generator stops on the config's eos id: take generation_config's first when config.json has none.
        if (!ck.eos_ids.empty() && (!raw.config.contains("eos_token_id") || raw.config["eos_token_id"].is_null()))
          raw.config["eos_token_id"] = ck.eos_ids.front();
      }
      if (g.is_object() && g.contains("bos_token_id")) {
        auto b = id_list(g["bos_token_id"], gen_source, "bos_token_id");
        if (!b.empty()) ck.bos_id = b.front();
      }
    }
    tokenizer_dir = dir.string();
    // The chat template and the special-token texts it sees. Like transformers (4.43+), a
    // chat_template.jinja file takes precedence over tokenizer_config.json's `chat_template`.
    const fs::path tok_config = dir / "tokenizer_config.json";
    if (fs::exists(tok_config)) {
      const json tc = read_json(tok_config.string());
      ck.chat_template = chat_template_field(tc, tok_config.string(), ck.warnings);
      ck.bos_token = special_token_text(tc, "bos_token");
      ck.eos_token = special_token_text(tc, "eos_token");
      // A key that is there (even null: Qwen's "bos_token": null) is the model's word: no fallback.
      bos_named = tc.is_object() && tc.contains("bos_token");
      eos_named = tc.is_object() && tc.contains("eos_token");
    }
    const fs::path template_file = dir / "chat_template.jinja";
    if (fs::exists(template_file)) ck.chat_template = read_text_file(template_file.string(), kMaxTemplateBytes);
  } else if (ck.format == "gguf") {
    GGUFModel g = load_gguf_model(path);
    raw.source = raw.config_source = path;
    raw.config = std::move(g.config);
    raw.tensors = std::move(g.tensors);
    const io::GGUFFile f = io::GGUFFile::open(path);
    if (o.tokenizer_path.empty()) tokenizer = gguf_tokenizer(f, ck.tokenizer_source);
    if (const io::GGUFValue* t = f.find("tokenizer.chat_template")) ck.chat_template = t->as_string();
  } else {
    Llama2cModel c = [&] {
      try {
        return load_llama2c_model(path);
      } catch (const FormatError& e) {
        throw FormatError(std::string(e.what()) + " (read as llama2.c: the file has neither the GGUF magic nor a "
                                                  "safetensors header)");
      }
    }();
    raw.source = raw.config_source = path;
    raw.config = std::move(c.config);
    raw.tensors = std::move(c.tensors);
  }

  const bool ids_from_gen = !ck.eos_ids.empty();
  const bool bos_from_gen = ck.bos_id >= 0;
  if (raw.config.is_object()) {
    if (ck.eos_ids.empty()) ck.eos_ids = id_list(raw.config.value("eos_token_id", json()), raw.config_source, "eos_token_id");
    if (ck.bos_id < 0) {
      auto b = id_list(raw.config.value("bos_token_id", json()), raw.config_source, "bos_token_id");
      if (!b.empty()) ck.bos_id = b.front();
    }
  }
  Decoder decoder = assemble(raw, o, ck.warnings);
  vocab_size = decoder.config().vocab_size;
  check_id_range(ck.eos_ids, vocab_size, ids_from_gen ? gen_source : raw.config_source, "eos_token_id");
  if (ck.bos_id >= 0)
    check_id_range({ck.bos_id}, vocab_size, bos_from_gen ? gen_source : raw.config_source, "bos_token_id");

  // The tokenizer: --tokenizer, else what the checkpoint carries.
  std::string tok_path = o.tokenizer_path;
  if (tok_path.empty() && !tokenizer_dir.empty()) {
    for (const char* name : {"tokenizer.json", "tokenizer.json.zst", "vocab.json", "tokenizer.model", "tokenizer.bin"})
      if (fs::exists(fs::path(tokenizer_dir) / name)) {
        tok_path = (fs::path(tokenizer_dir) / name).string();
        break;
      }
  }
  if (!tok_path.empty()) {
    tokenizer = detail::load_tokenizer_file(tok_path, vocab_size);
    const bool llama2c = !fs::is_directory(tok_path) && tok_path.ends_with(".bin");
    ck.tokenizer_source = {llama2c ? "llama2c" : "file", tok_path, {}};
    if (llama2c) {
      ck.tokenizer_source.gguf_metadata = io::Llama2cTokenizer::load(tok_path, vocab_size).gguf_metadata();
    } else {
      try {
        ck.tokenizer_source.gguf_metadata = bpe_gguf_metadata(tok_path, vocab_size);
      } catch (const Error& e) {  // e.g. a SentencePiece .model: loads here, has no GGUF gpt2 form
        ck.warnings.push_back(std::string("tokenizer has no GGUF form; a GGUF written from it carries no vocabulary (") +
                              e.what() + ")");
      }
    }
  }
  if (!tokenizer) {
    const std::string hint = ck.format == "llama2c" ? " (a llama2.c checkpoint needs --tokenizer tokenizer.bin)"
                             : ck.format == "gguf"  ? " (the GGUF has no tokenizer.ggml.* metadata)"
                                                    : " (no tokenizer.json, vocab.json, tokenizer.model or tokenizer.bin)";
    CORELM_CHECK(!o.require_tokenizer, FormatError, path, ": no tokenizer", hint, "; pass --tokenizer PATH");
    ck.warnings.push_back(path + ": no tokenizer" + hint);
  } else {
    CORELM_CHECK(static_cast<int64_t>(tokenizer->vocab_size()) <= vocab_size, FormatError,
                 tok_path.empty() ? path : tok_path, ": the tokenizer's ", tokenizer->vocab_size(),
                 " ids exceed the model's vocab_size ", vocab_size);
    if (ck.eos_ids.empty() && tokenizer->eos_id()) ck.eos_ids.push_back(*tokenizer->eos_id());
    // bos_token / eos_token for the chat template when tokenizer_config.json names none: the
    // text of the tokenizer's own special ids (then the checkpoint's).
    auto text_of = [&](std::optional<TokenId> id) {
      return id && *id >= 0 && static_cast<size_t>(*id) < tokenizer->vocab_size() ? std::string(tokenizer->token_bytes(*id))
                                                                                 : std::string();
    };
    if (ck.bos_token.empty() && !bos_named) ck.bos_token = text_of(tokenizer->bos_id());
    if (ck.bos_token.empty() && !bos_named && ck.bos_id >= 0) ck.bos_token = text_of(static_cast<TokenId>(ck.bos_id));
    if (ck.eos_token.empty() && !eos_named) ck.eos_token = text_of(tokenizer->eos_id());
    if (ck.eos_token.empty() && !eos_named && !ck.eos_ids.empty())
      ck.eos_token = text_of(static_cast<TokenId>(ck.eos_ids.front()));
  }
  return Checkpoint{LoadedModel{std::move(decoder), std::move(tokenizer)}, ck.format, ck.eos_ids, ck.bos_id,
                    std::move(ck.tokenizer_source), std::move(ck.chat_template), std::move(ck.bos_token),
                    std::move(ck.eos_token), std::move(ck.warnings)};
}

}  // namespace corelm::model
