// corelm detokenize: ids -> text. stdin holds a JSON array (or whitespace-separated ids) and the
// raw bytes are written, so detokenize(tokenize(x)) == x; with --jsonl each line is a JSON array
// and each output line a JSON string. --input reads a binary token file instead.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/token_ids.h"
#include "corelm/tokenizer.h"

namespace corelm::cli {
namespace {

struct DetokenizeArgs {
  std::string tokenizer, input, dtype = "auto";
  bool jsonl = false, skip_special = false;
};

std::vector<TokenId> read_token_file(const std::string& path, std::string dtype, size_t vocab_size) {
  if (dtype == "auto") {
    std::ifstream side(path + ".json");
    CORELM_CHECK(side.good(), IOError, path, ".json is missing: pass --dtype uint16 or uint32");
    try {
      dtype = nlohmann::json::parse(side).value("dtype", std::string());
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(path + ".json: " + e.what());
    }
  }
  CORELM_CHECK(dtype == "uint16" || dtype == "uint32", ValueError, "--dtype must be uint16 or uint32 (got '", dtype, "')");
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t width = dtype == "uint16" ? 2 : 4;
  CORELM_CHECK(raw.size() % width == 0, FormatError, path, ": size ", raw.size(), " is not a multiple of ", width);
  std::vector<uint32_t> wide(raw.size() / width);
  for (size_t i = 0; i < wide.size(); ++i) {
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, raw.data() + 2 * i, 2);
      wide[i] = v;
    } else {
      std::memcpy(&wide[i], raw.data() + 4 * i, 4);
    }
  }
  check_token_ids(wide, path, vocab_size);  // a uint32 past 2^31 must not wrap to a negative id
  return std::vector<TokenId>(wide.begin(), wide.end());
}

void run(const DetokenizeArgs& a) {
  auto tok = Tokenizer::load(a.tokenizer);
  std::ios::sync_with_stdio(false);
  if (!a.input.empty()) {
    std::cout << tok->decode(read_token_file(a.input, a.dtype, tok->vocab_size()), a.skip_special);
    return;
  }
  if (a.jsonl) {
    std::string line;
    size_t line_no = 0;
    while (std::getline(std::cin, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::string text =
          tok->decode(parse_token_ids(line, "stdin line " + std::to_string(line_no), tok->vocab_size()), a.skip_special);
      // JSON strings are Unicode: invalid UTF-8 (possible with byte-level ids) becomes U+FFFD.
      std::cout << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    return;
  }
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::cout << tok->decode(parse_token_ids(text, "stdin", tok->vocab_size()), a.skip_special);
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
