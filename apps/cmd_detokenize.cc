// corelm detokenize: ids -> text. stdin holds a JSON array (or whitespace-separated ids) and the
// raw bytes are written, so detokenize(tokenize(x)) == x; with --jsonl each line is a JSON array
// and each output line a JSON string. --input reads a binary token file instead.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/tokenizer.h"

namespace corelm::cli {
namespace {

struct DetokenizeArgs {
  std::string tokenizer, input, dtype = "auto";
  bool jsonl = false, skip_special = false;
};

std::vector<TokenId> parse_ids(const std::string& text, const std::string& where) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  if (text[first] == '[') {
    try {
      return nlohmann::json::parse(text).get<std::vector<TokenId>>();
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(where + ": expected a JSON array of token ids: " + e.what());
    }
  }
  std::vector<TokenId> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    try {
      size_t used = 0;
      long v = std::stol(word, &used);
      CORELM_CHECK(used == word.size(), FormatError, where, ": '", word, "' is not a token id");
      ids.push_back(static_cast<TokenId>(v));
    } catch (const std::logic_error&) {
      throw FormatError(where + ": '" + word + "' is not a token id");
    }
  }
  return ids;
}

std::vector<TokenId> read_token_file(const std::string& path, std::string dtype) {
  if (dtype == "auto") {
    std::ifstream side(path + ".json");
    CORELM_CHECK(side.good(), IOError, path, ".json is missing: pass --dtype uint16 or uint32");
    dtype = nlohmann::json::parse(side).value("dtype", std::string());
  }
  CORELM_CHECK(dtype == "uint16" || dtype == "uint32", ValueError, "--dtype must be uint16 or uint32 (got '", dtype, "')");
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t width = dtype == "uint16" ? 2 : 4;
  CORELM_CHECK(raw.size() % width == 0, FormatError, path, ": size ", raw.size(), " is not a multiple of ", width);
  std::vector<TokenId> ids(raw.size() / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, raw.data() + 2 * i, 2);
      ids[i] = v;
    } else {
      uint32_t v;
      std::memcpy(&v, raw.data() + 4 * i, 4);
      ids[i] = static_cast<TokenId>(v);
    }
  }
  return ids;
}

void run(const DetokenizeArgs& a) {
  auto tok = Tokenizer::load(a.tokenizer);
  std::ios::sync_with_stdio(false);
  if (!a.input.empty()) {
    std::cout << tok->decode(read_token_file(a.input, a.dtype), a.skip_special);
    return;
  }
  if (a.jsonl) {
    std::string line;
    size_t line_no = 0;
    while (std::getline(std::cin, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::string text = tok->decode(parse_ids(line, "stdin line " + std::to_string(line_no)), a.skip_special);
      // JSON strings are Unicode: invalid UTF-8 (possible with byte-level ids) becomes U+FFFD.
      std::cout << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    return;
  }
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::cout << tok->decode(parse_ids(text, "stdin"), a.skip_special);
}

RegisterCommand reg([](CLI::App& root) {
  auto args = std::make_shared<DetokenizeArgs>();
  CLI::App* c = root.add_subcommand("detokenize", "Token ids to text (the exact bytes; JSON strings with --jsonl)");
  c->add_option("--tokenizer", args->tokenizer, "tokenizer.json[.zst], vocab.json, .model, or a model directory")->required();
  c->add_flag("--jsonl", args->jsonl, "each stdin line is a JSON array of ids; prints one JSON string per line");
  c->add_flag("--skip-special", args->skip_special, "leave out special tokens (BOS/EOS/...)");
  c->add_option("--input", args->input, "a binary token file written by `corelm tokenize --output`");
  c->add_option("--dtype", args->dtype, "id type of --input: auto (from INPUT.json), uint16, uint32");
  c->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
