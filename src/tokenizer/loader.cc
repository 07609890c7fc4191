// Tokenizer::load: decides from the path what kind of file it is and hands it to its loader.
#include <filesystem>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/file_io.h"
#include "tokenizer/spm_tokenizer.h"

namespace corelm {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const std::string& dir) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(tok::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ": invalid JSON: " + e.what());
  }
  tok::BpeSpec spec;
  try {
    spec = tok::parse_hf_tokenizer_json(doc, path);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type
    throw FormatError(path + ": unexpected JSON value: " + e.what());
  }
  tok::apply_tokenizer_config(spec, dir + "/tokenizer_config.json");
  return tok::make_bpe_tokenizer(std::move(spec));
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  if (tok::is_directory(path)) {
    for (const char* name : {"tokenizer.json", "tokenizer.json.zst", "vocab.json", "tokenizer.model"}) {
      std::string candidate = (fs::path(path) / name).string();
      if (tok::file_exists(candidate)) return load(candidate);
    }
    throw IOError(path + ": directory holds no tokenizer.json, tokenizer.json.zst, vocab.json or tokenizer.model");
  }
  CORELM_CHECK(tok::file_exists(path), IOError, path, ": no such tokenizer file");
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (ends_with(path, ".model")) return tok::load_sentencepiece(path, dir + "/tokenizer_config.json");
  if (ends_with(path, "vocab.json")) {
    std::string merges = dir + "/merges.txt";
    CORELM_CHECK(tok::file_exists(merges), IOError, path, ": merges.txt is missing beside it (expected ", merges, ")");
    tok::BpeSpec spec = tok::parse_vocab_merges(path, merges);
    tok::apply_tokenizer_config(spec, dir + "/tokenizer_config.json");
    return tok::make_bpe_tokenizer(std::move(spec));
  }
  if (ends_with(path, ".json") || ends_with(path, ".json.zst")) return load_tokenizer_json(path, dir);
  throw ValueError(path + ": unknown tokenizer file type (expected tokenizer.json[.zst], vocab.json, a .model file or a directory)");
}

}  // namespace corelm
