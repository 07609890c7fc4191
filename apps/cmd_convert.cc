// corelm convert IN OUT: any checkpoint corelm loads (model directory / Hugging Face folder, GGUF,
// llama2.c .bin with --tokenizer, single .safetensors) written as a corelm or Hugging Face folder or
// a llama.cpp GGUF file. Progress on stderr; --json prints a summary object on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/model_loader.h"

namespace corelm::cli {
namespace {

struct ConvertArgs {
  std::string in, out, to, dtype = "f32", tokenizer;
  uint64_t shard_size = 0;
  bool no_strict = false, json = false;
};

std::string dtype_list() {
  std::string s;
  for (const auto& n : model::gguf_save_dtypes()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

void run(const ConvertArgs& a) {
  const auto start = std::chrono::steady_clock::now();
  auto say = [&](const std::string& m) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[convert %.1fs] %s\n", s, m.c_str());
  };
  // Refuse an impossible target/dtype before the (slow) load.
  const std::string to = a.to.empty() ? (a.out.ends_with(".gguf") ? "gguf" : "corelm") : a.to;
  CORELM_CHECK(to == "corelm" || to == "hf" || to == "gguf", ValueError, "--to '", to, "' (supported: corelm, hf, gguf)");
  const auto& gguf_dtypes = model::gguf_save_dtypes();
  CORELM_CHECK(std::find(gguf_dtypes.begin(), gguf_dtypes.end(), a.dtype) != gguf_dtypes.end(), ValueError, "--dtype '",
               a.dtype, "' (supported: ", dtype_list(), ")");
  const bool plain = a.dtype == "f32" || a.dtype == "bf16" || a.dtype == "f16";
  CORELM_CHECK(plain || to == "gguf", ValueError, "--dtype ", a.dtype, " is a GGUF type; --to ", to,
               " takes f32, bf16 or f16");

  model::LoadOptions lo;
  lo.strict = !a.no_strict;
  lo.tokenizer_path = a.tokenizer;
  lo.require_tokenizer = false;  // weights convert without one; the summary says what was written
  say("loading " + a.in);
  model::Checkpoint ck = model::load_model(a.in, lo);
  for (const auto& w : ck.warnings) std::fprintf(stderr, "corelm: warning: %s\n", w.c_str());
  say("loaded " + ck.format + ": " + std::to_string(ck.model.decoder.config().num_parameters()) + " parameters");

  model::SaveOptions so;
  so.to = to;
  so.dtype = a.dtype;
  so.shard_size = a.shard_size;
  so.progress = say;
  model::SaveSummary s = model::save_model(ck, a.out, so);
  for (const auto& w : s.warnings) std::fprintf(stderr, "corelm: warning: %s\n", w.c_str());
  say("done: " + std::to_string(s.files.size()) + " file(s), " + std::to_string(s.bytes) + " bytes of tensors");
  if (a.json) {
    nlohmann::ordered_json j = {{"input", a.in},          {"input_format", ck.format},   {"output", a.out},
                                {"to", s.to},             {"dtype", s.dtype},            {"tensors", s.tensors},
                                {"bytes", s.bytes},       {"files", s.files},            {"tokenizer", s.tokenizer_written},
                                {"warnings", s.warnings}, {"load_warnings", ck.warnings}};
    std::cout << j.dump() << "\n";
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* c = root.add_subcommand("convert", "Convert a checkpoint between corelm/Hugging Face folders, GGUF and "
                                               "llama2.c (IN) and corelm/HF folders or GGUF (OUT)");
  c->add_option("IN", a->in, "model directory / HF folder, .gguf, llama2.c .bin, or .safetensors (config.json beside it)")
      ->required();
  c->add_option("OUT", a->out, "output directory, or a .gguf file")->required();
  c->add_option("--to", a->to, "corelm | hf | gguf (default: gguf for a .gguf OUT, else corelm)");
  c->add_option("--dtype", a->dtype, "2-D weights as f32 | bf16 | f16, or (gguf only) q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | "
                                     "q4_k | q5_k | q6_k (k-quants need rows of 256; other rows fall back, see "
                                     "docs/INTEROP.md)")->capture_default_str();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file/dir (required for llama2.c: tokenizer.bin)");
  c->add_option("--shard-size", a->shard_size, "folders: split model.safetensors into shards above this many bytes "
                                               "(default 2 GiB)");
  c->add_flag("--no-strict", a->no_strict, "load despite missing/unexpected tensors (warn instead of failing)");
  c->add_flag("--json", a->json, "print a JSON summary on stdout");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace corelm::cli
