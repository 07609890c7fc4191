// save_model: a loaded checkpoint written as a corelm/Hugging Face folder (config.json, safetensors
// shards + index.json, tokenizer files, generation_config.json) or as a llama.cpp GGUF file.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "corelm/architecture.h"
#include "corelm/error.h"
#include "corelm/model_loader.h"
#include "corelm/safetensors.h"
#include "model/model_loader_internal.h"

namespace corelm::model {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr uint64_t kDefaultShardBytes = 2ull << 30;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Tensor cast_weight(const Tensor& t, const std::string& dtype) {
  if (t.dim() != 2 || dtype == "f32") return t;
  return t.to(dtype == "bf16" ? DType::BF16 : DType::F16);
}

std::string torch_dtype_name(const std::string& dtype) {
  return dtype == "bf16" ? "bfloat16" : dtype == "f16" ? "float16" : "float32";
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// The chat template (and the bos/eos texts it sees) into tokenizer_config.json, which is where
// transformers and load_model look for it. A copied tokenizer_config.json that already yields the
// same template is left byte for byte as it was (a list of named templates stays a list).
void write_chat_template(const Checkpoint& ck, const fs::path& dir, const fs::path& final_dir, SaveSummary& s) {
  if (ck.chat_template.empty()) return;
  const fs::path path = dir / "tokenizer_config.json";
  const bool existed = fs::exists(path);
  ojson tc = ojson::object();
  if (existed) {
    try {
      tc = ojson::parse(read_bytes(path.string()));
    } catch (const nlohmann::json::exception&) {
      tc = ojson::object();
    }
    if (!tc.is_object()) tc = ojson::object();
  }
  const ojson& cur = tc.contains("chat_template") ? tc["chat_template"] : ojson();
  bool same = cur.is_string() && cur.get<std::string>() == ck.chat_template;
  if (cur.is_array())
    for (const auto& e : cur)
      if (e.is_object() && e.value("name", "") == "default" && e.value("template", "") == ck.chat_template) same = true;
  bool changed = !same;
  if (!same) tc["chat_template"] = ck.chat_template;
  if (!ck.bos_token.empty() && !tc.contains("bos_token")) tc["bos_token"] = ck.bos_token, changed = true;
  if (!ck.eos_token.empty() && !tc.contains("eos_token")) tc["eos_token"] = ck.eos_token, changed = true;
  if (!changed) return;
  io::write_file_atomic(path.string(), tc.dump(2) + "\n");
  if (!existed) s.files.push_back((final_dir / "tokenizer_config.json").string());
}

// Writes every file of the folder into `dir` (an empty staging folder); file names in the summary
// are those under `final_dir`, where the folder will be once committed.
void write_folder_files(const Checkpoint& ck, const fs::path& dir, const fs::path& final_dir, const SaveOptions& o,
                        SaveSummary& s) {
  auto say = [&](const std::string& m) {
    if (o.progress) o.progress(m);
  };
  const Decoder& d = ck.model.decoder;
  nlohmann::json config = d.config().to_json();
  config["torch_dtype"] = torch_dtype_name(o.dtype);
  io::write_file_atomic((dir / "config.json").string(), config.dump(2) + "\n");
  s.files.push_back((final_dir / "config.json").string());

  // Greedy packing in parameter order; a tensor larger than the limit gets a shard of its own.
  const uint64_t limit = o.shard_size ? o.shard_size : kDefaultShardBytes;
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& [name, p] : d.named_parameters()) {
    Tensor t = cast_weight(p, o.dtype);
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    if (!shards.back().empty() && in_shard + bytes > limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(name, t);
    in_shard += bytes;
    s.bytes += static_cast<int64_t>(bytes);
    ++s.tensors;
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    say("writing model.safetensors (" + std::to_string(s.tensors) + " tensors)");
    io::save_safetensors((dir / "model.safetensors").string(), shards[0], {{"format", "pt"}});
    written.push_back("model.safetensors");
  } else {
    ojson weight_map = ojson::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name = shard_name(i, shards.size());
      say("writing " + name);
      io::save_safetensors((dir / name).string(), shards[i], {{"format", "pt"}});
      for (const auto& [tensor, t] : shards[i]) weight_map[tensor] = name;
      written.push_back(name);
    }
    ojson index = {{"metadata", {{"total_size", s.bytes}}}, {"weight_map", weight_map}};
    io::write_file_atomic((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    written.push_back("model.safetensors.index.json");
  }
  for (const auto& w : written) s.files.push_back((final_dir / w).string());

  ojson gen = {{"_from_model_config", false}};
  if (ck.bos_id >= 0) gen["bos_token_id"] = ck.bos_id;
  if (ck.eos_ids.size() == 1) gen["eos_token_id"] = ck.eos_ids[0];
  if (ck.eos_ids.size() > 1) gen["eos_token_id"] = ck.eos_ids;
  io::write_file_atomic((dir / "generation_config.json").string(), gen.dump(2) + "\n");
  s.files.push_back((final_dir / "generation_config.json").string());

  // The tokenizer: copy its files, or rebuild tokenizer.json from a GGUF BPE vocabulary.
  const TokenizerSource& src = ck.tokenizer_source;
  // Converting a folder onto itself reads its files here, before the swap replaces them.
  auto copy = [&](const fs::path& from, const std::string& as) {
    io::write_file_atomic((dir / as).string(), read_bytes(from.string()));
    s.files.push_back((final_dir / as).string());
  };
  if (src.kind == "file" && !fs::is_directory(src.path)) {
    const fs::path from(src.path);
    copy(from, from.filename().string());
    if (from.filename() == "vocab.json" && fs::exists(from.parent_path() / "merges.txt"))
      copy(from.parent_path() / "merges.txt", "merges.txt");
    if (fs::exists(from.parent_path() / "tokenizer_config.json"))
      copy(from.parent_path() / "tokenizer_config.json", "tokenizer_config.json");
    s.tokenizer_written = true;
  } else if (src.kind == "llama2c") {
    copy(src.path, "tokenizer.bin");
    s.tokenizer_written = true;
  } else if (src.kind == "gguf") {
    GgufBpeVocab v;
    bool bpe = false;
    for (const auto& [k, val] : src.gguf_metadata) {
      if (k == "tokenizer.ggml.model") bpe = val.as_string() == "gpt2";
      else if (k == "tokenizer.ggml.tokens") v.tokens = val.as_array(io::GGUFType::String).strings();
      else if (k == "tokenizer.ggml.token_type") for (int64_t t : val.as_array(io::GGUFType::Int32).ints()) v.token_types.push_back(static_cast<int32_t>(t));
      else if (k == "tokenizer.ggml.merges") v.merges = val.as_array(io::GGUFType::String).strings();
      else if (k == "tokenizer.ggml.pre") v.pre = val.as_string();
      else if (k == "corelm.tokenizer.nfc") v.nfc = val.as_bool();
      else if (k == "corelm.tokenizer.ignore_merges") v.ignore_merges = val.as_bool();
    }
    if (bpe) {
      io::write_file_atomic((dir / "tokenizer.json").string(), gguf_bpe_vocab_to_tokenizer_json(v, src.path) + "\n");
      const Tokenizer* t = ck.model.tokenizer.get();
      ojson tc = ojson::object();
      auto text = [&](std::optional<TokenId> id) { return std::string(t->token_bytes(*id)); };
      if (t && t->bos_id()) tc["bos_token"] = text(t->bos_id());
      if (t && t->eos_id()) tc["eos_token"] = text(t->eos_id());
      if (t && t->pad_id()) tc["pad_token"] = text(t->pad_id());
      tc["add_bos_token"] = t && !t->special_prefix().empty();
      tc["add_eos_token"] = t && !t->special_suffix().empty();
      io::write_file_atomic((dir / "tokenizer_config.json").string(), tc.dump(2) + "\n");
      s.files.push_back((final_dir / "tokenizer.json").string());
      s.files.push_back((final_dir / "tokenizer_config.json").string());
      s.tokenizer_written = true;
    } else {
      s.warnings.push_back("the GGUF's SentencePiece-style vocabulary has no tokenizer.json form: no tokenizer "
                           "written (load the folder with --tokenizer, or convert to gguf instead)");
    }
  } else {
    s.warnings.push_back("no tokenizer loaded: none written");
  }
  write_chat_template(ck, dir, final_dir, s);
}

// The folder is written as a whole: staged beside the target and swapped in by one rename, so an
// interrupted convert leaves the old model directory complete (never new weights beside the old
// tokenizer.json). Files that are not part of a model (README.md, LICENSE, ...) are kept.
void write_folder(const Checkpoint& ck, const fs::path& dir, const SaveOptions& o, SaveSummary& s) {
  CORELM_CHECK(o.dtype == "f32" || o.dtype == "bf16" || o.dtype == "f16", ValueError, "convert: --dtype ", o.dtype,
               " is not available for --to ", o.to, " (f32, bf16, f16; ", o.dtype, " is a GGUF type: use --to gguf)");
  auto staged = detail::stage_model_dir(dir.string(), [](const std::string& name) { return !detail::is_model_file(name); });
  write_folder_files(ck, staged->path(), dir, o, s);
  if (o.progress) o.progress("committing " + dir.string());
  staged->commit();
}

// --dtype for --to gguf: a ggml type corelm writes, by its lower-case name.
io::GGMLType gguf_weight_type(const std::string& dtype) {
  const auto& names = gguf_save_dtypes();
  if (std::find(names.begin(), names.end(), dtype) != names.end()) return io::ggml_type_from_name(dtype);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw ValueError("convert: --dtype " + dtype + " is not available for --to gguf (" + list + ")");
}

void write_gguf(const Checkpoint& ck, const std::string& path, const SaveOptions& o, SaveSummary& s) {
  const io::GGMLType type = gguf_weight_type(o.dtype);
  const Decoder& d = ck.model.decoder;
  std::vector<std::pair<std::string, io::GGUFValue>> extra = ck.tokenizer_source.gguf_metadata;
  if (extra.empty()) s.warnings.push_back("no GGUF tokenizer metadata: llama.cpp will need a vocabulary from elsewhere");
  s.tokenizer_written = !extra.empty();
  if (!ck.chat_template.empty()) extra.push_back({"tokenizer.chat_template", io::GGUFValue::of_string(ck.chat_template)});
  s.tensors = static_cast<int64_t>(d.named_parameters().size());
  if (o.progress) o.progress("writing " + path + " (" + std::to_string(s.tensors) + " tensors, " + o.dtype + ")");
  save_gguf_model(path, d.config().to_json(), d.named_parameters(), type, extra);
  s.files.push_back(path);
  s.bytes = static_cast<int64_t>(fs::file_size(path));
}

}  // namespace

const std::vector<std::string>& gguf_save_dtypes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (io::GGMLType t : {io::GGMLType::F32, io::GGMLType::BF16, io::GGMLType::F16, io::GGMLType::Q8_0,
                           io::GGMLType::Q4_0, io::GGMLType::Q4_1, io::GGMLType::Q5_0, io::GGMLType::Q5_1,
                           io::GGMLType::Q4_K, io::GGMLType::Q5_K, io::GGMLType::Q6_K}) {
      std::string n = io::ggml_type_name(t);
      for (auto& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      v.push_back(n);
    }
    return v;
  }();
  return names;
}

SaveSummary save_model(const Checkpoint& ck, const std::string& path, const SaveOptions& options) {
  SaveOptions o = options;
  if (o.to.empty()) o.to = path.ends_with(".gguf") ? "gguf" : "corelm";
  CORELM_CHECK(o.to == "corelm" || o.to == "hf" || o.to == "gguf", ValueError, "convert: --to '", o.to,
               "' (supported: corelm, hf, gguf)");
  SaveSummary s;
  s.to = o.to;
  s.dtype = o.dtype;
  if (o.to == "gguf") write_gguf(ck, path, o, s);
  else write_folder(ck, path, o, s);
  return s;
}

}  // namespace corelm::model
