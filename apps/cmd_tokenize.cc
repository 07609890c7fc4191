// corelm tokenize: text -> ids. stdin -> one JSON array (or one per line with --jsonl), or a
// corpus -> binary token file for the trainer with --output.
#include <algorithm>
#include <charconv>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_corpus.h"

namespace corelm::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer, output, dtype = "auto";
  std::vector<std::string> inputs;
  bool jsonl = false, add_special = false, parse_special = false, no_progress = false;
  int threads = 0;
};

void append_ids(std::string& out, const std::vector<TokenId>& ids) {
  out.push_back('[');
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    auto r = std::to_chars(buf, buf + sizeof buf, ids[i]);
    out.append(buf, r.ptr);
  }
  out.push_back(']');
}

std::string line_text(const std::string& line, size_t line_no) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("stdin line " + std::to_string(line_no) + ": invalid JSON: " + e.what());
  }
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("text") && j["text"].is_string()) return j["text"].get<std::string>();
  throw FormatError("stdin line " + std::to_string(line_no) + ": expected a JSON string or an object with \"text\"");
}

void run(const TokenizeArgs& a) {
  CORELM_CHECK(a.threads >= 0 && a.threads <= kMaxThreads, ValueError, "--threads must be in [0, ", kMaxThreads,
               "] (0: all cores; got ", a.threads, ")");
  auto tok = Tokenizer::load(a.tokenizer);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = a.threads > 0 ? a.threads : std::min(kMaxThreads, cores);
  EncodeOptions enc;
  enc.add_special = a.add_special;
  enc.parse_special = a.parse_special;
  if (!a.output.empty()) {
    CORELM_CHECK(!a.inputs.empty(), ValueError, "--output needs --input files (the corpus to tokenize)");
    TokenFileOptions opt;
    opt.threads = threads;
    opt.add_special = a.add_special;
    opt.parse_special = a.parse_special;
    opt.jsonl = a.jsonl;
    opt.progress = !a.no_progress;
    if (a.dtype == "uint16") opt.dtype = TokenDType::kUInt16;
    else if (a.dtype == "uint32") opt.dtype = TokenDType::kUInt32;
    else CORELM_CHECK(a.dtype == "auto", ValueError, "--dtype must be auto, uint16 or uint32");
    TokenFileStats s = tokenize_to_file(*tok, a.inputs, a.output, opt);
    nlohmann::ordered_json summary{{"output", a.output},
                                   {"dtype", s.dtype_bytes == 2 ? "uint16" : "uint32"},
                                   {"documents", s.documents},
                                   {"bytes", s.bytes},
                                   {"tokens", s.tokens},
                                   {"seconds", s.seconds},
                                   {"threads", threads}};
    std::cout << summary.dump() << "\n";
    return;
  }
  std::ios::sync_with_stdio(false);
  if (!a.inputs.empty() && !a.jsonl) {  // one JSON array per input file
    for (const std::string& path : a.inputs) {
      std::ifstream in(path, std::ios::binary);
      CORELM_CHECK(in.good(), IOError, path, ": cannot open");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::string out;
      append_ids(out, encode_parallel(*tok, text, enc, threads));
      std::cout << out << "\n";
    }
    return;
  }
  CORELM_CHECK(a.inputs.empty(), ValueError, "--jsonl reads stdin; use --output to tokenize JSONL files into a token file");
  if (a.jsonl) {
    std::string line, out;
    size_t line_no = 0;
    while (std::getline(std::cin, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      out.clear();
      append_ids(out, tok->encode(line_text(line, line_no), enc));
      out.push_back('\n');
      std::cout << out;
    }
    return;
  }
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::string out;
  append_ids(out, encode_parallel(*tok, text, enc, threads));
  std::cout << out << "\n";
}

RegisterCommand reg([](CLI::App& root) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* c = root.add_subcommand("tokenize", "Text to token ids (stdin -> JSON), or a corpus to a binary token file");
  c->add_option("--tokenizer", args->tokenizer, "tokenizer.json[.zst], vocab.json (merges.txt beside), .model, or a model directory")
      ->required();
  c->add_flag("--jsonl", args->jsonl, "each input line is a JSON string (or object with \"text\"); one JSON array per line");
  c->add_flag("--add-special", args->add_special, "add BOS/EOS as the tokenizer's configuration says (default: none)");
  c->add_flag("--parse-special", args->parse_special,
              "recognise special-token text such as <|endoftext|> in the input (default: plain text)");
  c->add_option("--input", args->inputs,
                "input files instead of stdin (one JSON array each); with --output the corpus (text: one document per "
                "file; --jsonl: per line)");
  c->add_option("--output", args->output, "write a binary token file (raw little-endian ids) plus OUTPUT.json");
  c->add_option("--dtype", args->dtype, "token file id type: auto, uint16, uint32")->capture_default_str();
  c->add_option("--threads", args->threads, "worker threads, up to 1024 (default, 0: all cores)");
  c->add_flag("--no-progress", args->no_progress, "no progress line on stderr");
  c->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
