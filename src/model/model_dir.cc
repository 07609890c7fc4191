// Model directories (config.json + model.safetensors + tokenizer.json), HF layout, and the one
// way corelm replaces one: a staged folder swapped in whole (see model_dir.h).
#include "corelm/model_dir.h"


#include <filesystem>

#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/model_loader.h"
#include "corelm/safetensors.h"
#include "model/model_loader_internal.h"

namespace corelm::model {
namespace fs = std::filesystem;

namespace detail {

bool is_model_file(const std::string& name) {
  return name == "config.json" || name == "generation_config.json" || name.ends_with(".safetensors") ||
         name.ends_with(".safetensors.index.json") || name.starts_with("pytorch_model") ||
         name.starts_with("tokenizer") || name == "vocab.json" || name == "merges.txt" ||
         name == "special_tokens_map.json" || name == "added_tokens.json" || name.starts_with("chat_template");
}

void check_replaceable_model_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  CORELM_CHECK(fs::is_directory(dir, ec), IOError, dir, ": exists and is not a folder (a model is written as a folder)");
  bool empty = true;
  for (const auto& e : fs::directory_iterator(dir)) {
    empty = false;
    if (is_model_file(e.path().filename().string())) return;
  }
  CORELM_CHECK(empty, IOError, dir, ": a folder that holds no model files (no config.json, *.safetensors, ",
               "tokenizer.json ...); refusing to replace it -- give a new or empty folder, or a model directory");
}

// A writer killed mid-way (kill -9, power cut) leaves its ".<name>.staging.<pid>.<n>" folder --
// or, killed between the swap and the clean-up, ".<name>.old.<pid>.<n>" -- beside the target.
// The target itself is complete either way; the next writer removes the litter of dead writers.
void remove_dead_writers_litter(const fs::path& target) {
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string name = target.filename().string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    for (const std::string tag : {".staging.", ".old."}) {
      const std::string prefix = "." + name + tag;
      if (!n.starts_with(prefix)) continue;
      const long pid = temp_writer_pid(n, prefix);
      if (pid > 0 && !process_alive(pid)) fs::remove_all(e.path(), ec);
    }
  }
}

std::unique_ptr<StagedDir> stage_model_dir(const std::string& target, const std::function<bool(const std::string&)>& keep) {
  // "out/", "." and "models/.." name a folder by a path whose last part is no name to stage
  // beside: work on the normalized absolute path.
  std::string dir = fs::absolute(target).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  check_replaceable_model_dir(dir);
  const fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  remove_dead_writers_litter(fs::path(dir));
  auto staged = std::make_unique<StagedDir>(dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return staged;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!keep(name)) continue;
    const fs::path to = fs::path(staged->path()) / name;
    // Hard links cost nothing and are safe here: every corelm writer replaces a file by rename,
    // never in place, so the old folder's removal after the swap leaves the kept files intact.
    std::error_code link_ec;
    if (e.is_symlink()) fs::copy_symlink(e.path(), to, link_ec);
    else if (e.is_directory()) fs::copy(e.path(), to, fs::copy_options::recursive | fs::copy_options::create_hard_links, link_ec);
    else fs::create_hard_link(e.path(), to, link_ec);
    if (link_ec) {
      fs::remove_all(to, ec);
      try {
        fs::copy(e.path(), to, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
      } catch (const fs::filesystem_error& err) {
        throw IOError("cannot keep '" + e.path().string() + "' in the new model folder: " + err.code().message());
      }
    }
  }
  return staged;
}

}  // namespace detail

LoadedModel load_model_dir(const std::string& dir) {
  CORELM_CHECK(fs::is_directory(dir), IOError, dir, ": not a directory (expected a model directory with ",
               "config.json, model.safetensors, tokenizer.json)");
  // One loader for every entry point: the same shape, bound and finiteness checks as load_model.
  LoadOptions o;
  o.require_tokenizer = true;
  Checkpoint ck = load_model(dir, o);
  return std::move(ck.model);
}

void write_model_files(const std::string& dir, const Decoder& decoder) {
  fs::create_directories(dir);
  decoder.config().save((fs::path(dir) / "config.json").string());
  io::save_safetensors((fs::path(dir) / "model.safetensors").string(), decoder.named_parameters(),
                       {{"format", "pt"}});
}

void save_model_dir(const std::string& dir, const Decoder& decoder) {
  // The other weight layout (an index and its shards) would shadow or confuse the new weights.
  auto staged = detail::stage_model_dir(dir, [](const std::string& name) {
    return name != "config.json" && !name.ends_with(".safetensors") && !name.ends_with(".safetensors.index.json");
  });
  write_model_files(staged->path(), decoder);
  staged->commit();
}

}  // namespace corelm::model
