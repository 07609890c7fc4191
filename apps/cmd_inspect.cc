// corelm inspect PATH [--json]: what a checkpoint holds — its format (safetensors, GGUF, llama2.c
// .bin, or a model directory), the model config when the file carries one, every tensor's name,
// dtype and shape, and the parameter count. Only headers are read for safetensors and GGUF.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/architecture.h"
#include "corelm/gguf.h"
#include "corelm/llama2c.h"
#include "corelm/safetensors.h"
#include "corelm/utf8.h"

namespace corelm::cli {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct InspectArgs {
  std::string path;
  bool json = false;
};

// Strings from files (GGUF keys, values and tensor names; file names) are raw bytes, and JSON
// output must be valid UTF-8: invalid bytes are shown as "\xNN" rather than failing the whole
// dump (issue 13).
std::string text(std::string_view s) { return escape_invalid_utf8(s); }

ojson tensor_entry(const std::string& name, const std::string& dtype, const Shape& shape, uint64_t bytes,
                   int64_t& total) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  total += n;
  return {{"name", name}, {"dtype", dtype}, {"shape", shape}, {"bytes", bytes}};
}

void add_safetensors(const std::string& file, ojson& tensors, int64_t& total, ojson* metadata) {
  auto f = io::SafetensorsFile::open(file);
  if (metadata && !f.metadata().empty()) *metadata = f.metadata();
  for (const auto& name : f.names()) {
    Tensor t = f.get(name);
    tensors.push_back(tensor_entry(text(name), dtype_name(t.dtype()), t.shape(),
                                   static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype()), total));
  }
}

ojson gguf_value_json(const io::GGUFValue& v) {
  using T = io::GGUFType;
  switch (v.type) {
    case T::String: return text(v.s);
    case T::Bool: return v.i != 0;
    case T::Float32: case T::Float64: return v.f;
    case T::Uint64: return v.u;
    case T::Array:
      // Vocabularies hold 10^5 entries: a summary says enough.
      if (v.array.size() > 16)
        return "[" + std::to_string(v.array.size()) + " x " + io::gguf_type_name(v.array.type()) + "]";
      else {
        ojson a = ojson::array();
        for (const auto& e : v.array) a.push_back(gguf_value_json(e));
        return a;
      }
    default: return v.as_int();
  }
}

std::string detect(const std::string& path) {
  if (fs::is_directory(path)) return "directory";
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, "inspect: cannot open '", path, "'");
  char head[9] = {};
  in.read(head, 9);
  if (in.gcount() >= 4 && std::memcmp(head, "GGUF", 4) == 0) return "gguf";
  if (in.gcount() == 9 && head[8] == '{') return "safetensors";
  return "llama2c";  // no magic of its own: its header is validated when read
}

ojson inspect(const std::string& path) {
  std::string format = detect(path);
  ojson out = {{"path", text(path)}, {"format", format}};
  ojson tensors = ojson::array();
  int64_t total = 0;
  std::string file = path;
  if (format == "directory") {
    const fs::path dir(path);
    if (fs::exists(dir / "config.json")) out["config"] = ojson::parse(std::ifstream(dir / "config.json"));
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
      // Sharded: list each shard named by the index once, in name order.
      const ojson j = ojson::parse(std::ifstream(index), nullptr, /*allow_exceptions=*/false);
      CORELM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), FormatError,
                   index.string(), ": missing object field 'weight_map'");
      std::set<std::string> shards;
      for (const auto& [name, shard] : j["weight_map"].items())
        if (shard.is_string()) shards.insert(shard.get<std::string>());
      out["shards"] = shards;
      for (const auto& shard : shards) add_safetensors((dir / shard).string(), tensors, total, nullptr);
      format = "sharded safetensors";
    } else {
      CORELM_CHECK(fs::exists(dir / "model.safetensors"), IOError, "inspect: '", path,
                   "' has no model.safetensors or model.safetensors.index.json");
      file = (dir / "model.safetensors").string();
      format = "safetensors";
    }
    out["format"] = "model directory (" + format + ")";
  } else if (format == "safetensors" && fs::exists(fs::path(path).parent_path() / "config.json")) {
    out["config"] = ojson::parse(std::ifstream(fs::path(path).parent_path() / "config.json"));
  }
  if (format == "sharded safetensors") {
    // listed above, shard by shard
  } else if (format == "safetensors") {
    ojson meta;
    add_safetensors(file, tensors, total, &meta);
    if (!meta.is_null()) out["metadata"] = meta;
  } else if (format == "gguf") {
    auto f = io::GGUFFile::open(file);
    out["version"] = f.version();
    ojson meta = ojson::object();
    for (const auto& [k, v] : f.metadata()) meta[text(k)] = gguf_value_json(v);
    out["metadata"] = meta;
    // Each tensor's ggml type is its "dtype"; a count per type says what a file is quantised to
    // (llama.cpp files mix types: Q4_K_M keeps some tensors Q6_K, norms F32).
    std::map<std::string, int64_t> per_type;
    for (const auto& t : f.tensors()) {
      tensors.push_back(tensor_entry(text(t.name), io::ggml_type_name(t.type), t.shape(), t.nbytes, total));
      ++per_type[io::ggml_type_name(t.type)];
    }
    out["ggml_types"] = per_type;
    try {
      out["config"] = model::load_gguf_model(file).config;
    } catch (const Error& e) {
      out["config_error"] = text(e.what());  // not a Llama/Qwen2 model file (e.g. vocab-only)
    }
  } else {
    auto ck = io::load_llama2c_checkpoint(file);
    out["config"] = model::llama2c_model(ck).config;
    for (const auto& [name, t] : ck.tensors)
      tensors.push_back(tensor_entry(text(name), "f32", t.shape(), static_cast<uint64_t>(t.numel()) * 4, total));
  }
  uint64_t bytes = 0;
  for (const auto& t : tensors) bytes += t["bytes"].get<uint64_t>();
  out["tensors"] = tensors;
  out["num_parameters"] = total;
  out["tensor_bytes"] = bytes;
  return out;
}

void run(const InspectArgs& args) {
  const ojson r = inspect(args.path);
  if (args.json) {
    // Every string from a file was escaped above; `replace` only guards against one missed.
    std::cout << r.dump(2, ' ', false, ojson::error_handler_t::replace) << "\n";
    return;
  }
  std::cout << "path:       " << r["path"].get<std::string>() << "\nformat:     " << r["format"].get<std::string>();
  if (r.contains("version")) std::cout << " v" << r["version"];
  std::cout << "\n";
  if (r.contains("config")) {
    const auto& c = r["config"];
    std::cout << "config:     " << c.value("model_type", std::string("?")) << ", vocab " << c.value("vocab_size", 0)
              << ", hidden " << c.value("hidden_size", 0) << ", layers " << c.value("num_hidden_layers", 0)
              << ", heads " << c.value("num_attention_heads", 0) << "/" << c.value("num_key_value_heads", 0)
              << ", ffn " << c.value("intermediate_size", 0) << ", context " << c.value("max_position_embeddings", 0)
              << ", tied " << (c.value("tie_word_embeddings", false) ? "yes" : "no") << "\n";
    // Per-layer kinds (sliding-window / linear-attention models): one entry per layer.
    if (c.contains("layer_types") && c["layer_types"].is_array()) {
      std::string kinds;
      for (const auto& k : c["layer_types"]) {
        const std::string kind = k.is_string() ? k.get<std::string>() : k.dump();
        kinds += (kinds.empty() ? "" : ", ") + kind;
        if (kind == "sliding_attention" && c.contains("sliding_window"))
          kinds += " (window " + c["sliding_window"].dump() + ")";
        if (kind == "linear_attention" && c.contains("linear_attention_state_size"))
          kinds += " (state " + c["linear_attention_state_size"].dump() + ")";
      }
      std::cout << "layer types: " << kinds << (c.value("bos_isolation", false) ? "; bos_isolation" : "") << "\n";
    }
    if (c.contains("classifier_pooling") && c.contains("id2label") && c["id2label"].is_object()) {
      std::string names;
      for (const auto& [k, v] : c["id2label"].items()) names += (names.empty() ? "" : ",") + (v.is_string() ? v.get<std::string>() : v.dump());
      std::cout << "classifier: score.weight, " << c["id2label"].size() << " labels (" << names << "), pooling "
                << c["classifier_pooling"].dump() << ", temperature " << c.value("classifier_temperature", 1.0) << "\n";
    }
  }
  if (r.contains("metadata"))
    for (const auto& [k, v] : r["metadata"].items()) std::cout << "  " << k << " = " << v.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
  std::cout << "tensors:    " << r["tensors"].size();
  if (r.contains("ggml_types")) {
    std::string types;
    for (const auto& [type, n] : r["ggml_types"].items()) types += (types.empty() ? "" : ", ") + type + " x " + n.dump();
    std::cout << " (" << types << ")";
  }
  std::cout << "\n";
  for (const auto& t : r["tensors"])
    std::cout << "  " << t["name"].get<std::string>() << "  " << t["dtype"].get<std::string>() << "  "
              << t["shape"].dump() << "  " << t["bytes"].get<uint64_t>() << " B\n";
  std::cout << "parameters: " << r["num_parameters"].get<int64_t>() << " (" << r["tensor_bytes"].get<uint64_t>()
            << " bytes of tensors)\n";
}

RegisterCommand reg([](CLI::App& root) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* c = root.add_subcommand("inspect", "Show a checkpoint's format, config, tensors and parameter count "
                                               "(safetensors, GGUF, llama2.c .bin, or a model directory / HF folder, sharded or not)");
  c->add_option("path", args->path, "model file or directory")->required();
  c->add_flag("--json", args->json, "print JSON");
  c->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
