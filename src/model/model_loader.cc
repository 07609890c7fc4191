// load_model: every checkpoint form -> (HF config.json object, HF-named tensors, tokenizer) ->
// one strict (or lenient) assembly into a Decoder. See model_loader.h.
#include "corelm/model_loader.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "corelm/error.h"
#include "corelm/llama2c.h"
#include "corelm/safetensors.h"
#include "model/model_loader_internal.h"

namespace corelm::model {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct RawCheckpoint {
  std::string source;  // what error messages name: the index.json, the .safetensors, the .gguf, the .bin
  json config;
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<io::SafetensorsFile> keep_open;  // zero-copy views point into these mappings
};

json read_json(const std::string& path) {
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
      const int64_t window = c["sliding_window"].get<int64_t>();
      CORELM_CHECK(window >= max_pos, FormatError, source, ": field 'sliding_window' is ", window,
                   " (< max_position_embeddings ", max_pos,
                   "): sliding-window attention is not supported; only Mistral-style models without it load");
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

std::vector<int64_t> id_list(const json& v) {
  std::vector<int64_t> out;
  if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  if (v.is_array())
    for (const auto& e : v)
      if (e.is_number_integer()) out.push_back(e.get<int64_t>());
  return out;
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
  auto id_of = [&](const char* key) -> std::optional<TokenId> {
    const io::GGUFValue* v = f.find(key);
    if (!v) return std::nullopt;
    return static_cast<TokenId>(v->as_int(0, std::numeric_limits<TokenId>::max()));
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

// Builds the decoder from a raw checkpoint: strict or lenient name matching, shapes always checked.
Decoder assemble(RawCheckpoint& raw, const LoadOptions& o, std::vector<std::string>& warnings) {
  ModelConfig config = ModelConfig::from_json(raw.config, raw.source);
  Decoder decoder(config);
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> unexpected, missing;
  for (const auto& [name, t] : raw.tensors) {
    if (name.ends_with("rotary_emb.inv_freq")) continue;  // HF's RoPE buffer, recomputed
    if (decoder.has_parameter(name)) given[name] = &t;
    else if (!(name == "lm_head.weight" && config.tie_word_embeddings)) unexpected.push_back(name);
  }
  for (const auto& [name, p] : decoder.named_parameters())
    if (!given.count(name)) missing.push_back(name);
  if (!missing.empty() || !unexpected.empty()) {
    std::string what;
    if (!missing.empty()) what += "missing tensors: " + join(missing);
    if (!unexpected.empty()) what += std::string(what.empty() ? "" : "; ") + "unexpected: " + join(unexpected);
    CORELM_CHECK(!o.strict, FormatError, raw.source, ": ", what, " (strict mode; --no-strict loads anyway)");
    warnings.push_back(raw.source + ": " + what + " (non-strict: missing keep their initialisation, unexpected are ignored)");
    if (!missing.empty()) decoder.init_weights(0);
  }
  for (const auto& [name, t] : given) {
    const Tensor& param = decoder.parameter(name);
    CORELM_CHECK(t->shape() == param.shape(), FormatError, raw.source, ": tensor '", name, "' has shape ",
                 shape_str(t->shape()), ", the config needs ", shape_str(param.shape()));
    Tensor v = *t;
    round_to(o.dtype, v);
    decoder.load_parameter(name, v);
  }
  return decoder;
}

}  // namespace

std::string detect_checkpoint_format(const std::string& path) {
  if (fs::is_directory(path)) return "model-dir";
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open (expected a model directory, .gguf, .safetensors or llama2.c .bin)");
  char head[9] = {};
  in.read(head, 9);
  if (in.gcount() >= 4 && std::memcmp(head, "GGUF", 4) == 0) return "gguf";
  if (in.gcount() == 9 && head[8] == '{') return "safetensors";
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
    std::vector<std::string> warnings;
  } ck;
  ck.format = detect_checkpoint_format(path);
  RawCheckpoint raw;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_dir;  // where a directory-style checkpoint looks for its tokenizer
  int64_t vocab_size = 0;

  if (ck.format == "model-dir" || ck.format == "safetensors") {
    const fs::path dir = ck.format == "model-dir" ? fs::path(path) : fs::path(path).parent_path();
    const fs::path config_path = dir / "config.json";
    CORELM_CHECK(fs::exists(config_path), IOError, config_path.string(), ": missing (a Hugging Face / corelm model ",
                 "needs config.json beside its weights)");
    raw.config = read_json(config_path.string());
    check_supported(raw.config, config_path.string());
    if (ck.format == "safetensors") read_safetensors(path, raw);
    else if (fs::exists(dir / "model.safetensors.index.json")) read_sharded(dir, raw);
    else {
      CORELM_CHECK(fs::exists(dir / "model.safetensors"), IOError, path, ": no model.safetensors or ",
                   "model.safetensors.index.json (pytorch_model.bin checkpoints are not supported: convert them to "
                   "safetensors)");
      read_safetensors((dir / "model.safetensors").string(), raw);
    }
    const fs::path gen = dir / "generation_config.json";
    if (fs::exists(gen)) {
      json g = read_json(gen.string());
      if (g.is_object() && g.contains("eos_token_id")) {
        ck.eos_ids = id_list(g["eos_token_id"]);
        // The generator stops on the config's eos id: take generation_config's first when config.json has none.
        if (!ck.eos_ids.empty() && (!raw.config.contains("eos_token_id") || raw.config["eos_token_id"].is_null()))
          raw.config["eos_token_id"] = ck.eos_ids.front();
      }
      if (g.is_object() && g.contains("bos_token_id") && g["bos_token_id"].is_number_integer())
        ck.bos_id = g["bos_token_id"].get<int64_t>();
    }
    tokenizer_dir = dir.string();
  } else if (ck.format == "gguf") {
    io::GGUFModel g = io::load_gguf_model(path);
    raw.source = path;
    raw.config = std::move(g.config);
    raw.tensors = std::move(g.tensors);
    if (o.tokenizer_path.empty()) tokenizer = gguf_tokenizer(io::GGUFFile::open(path), ck.tokenizer_source);
  } else {
    io::Llama2cCheckpoint c = io::load_llama2c_checkpoint(path);
    raw.source = path;
    raw.config = std::move(c.config);
    raw.tensors = std::move(c.tensors);
  }

  if (ck.eos_ids.empty()) ck.eos_ids = id_list(raw.config.value("eos_token_id", json()));
  if (ck.bos_id < 0) {
    auto b = id_list(raw.config.value("bos_token_id", json()));
    if (!b.empty()) ck.bos_id = b.front();
  }
  Decoder decoder = assemble(raw, o, ck.warnings);
  vocab_size = decoder.config().vocab_size;

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
  }
  return Checkpoint{LoadedModel{std::move(decoder), std::move(tokenizer)}, ck.format, ck.eos_ids, ck.bos_id,
                    std::move(ck.tokenizer_source), std::move(ck.warnings)};
}

}  // namespace corelm::model
