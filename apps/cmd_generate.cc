// corelm generate: text from a model directory. One prompt streams its text to stdout as it is
// generated; --prompt-file generates one prompt per line in a single batch. Throughput (prefill
// and decode separately) goes to stderr; --json prints one JSON object per prompt instead.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "kv_cache_flags.h"
#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/model_loader.h"
#include "corelm/thread_pool.h"

namespace corelm::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt, prompt_file, truncate = "none";
  bool prompt_given = false;  // --prompt "" is a prompt (generation starts from BOS alone)
  std::string tokenizer;  // --tokenizer: overrides / supplies the checkpoint's
  bool strict = true;
  int64_t max_new_tokens = 128;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;
  int64_t top_k = 0, no_repeat_ngram = 0;
  uint64_t seed = 0;
  bool greedy = false, json = false, ignore_eos = false, no_special = false;
  std::vector<std::string> stop;
  int threads = 1;
  int64_t batch_size = 16;
  std::string precision = "bf16";  // f32: the reference path
  std::string cache_type_k = "f32", cache_type_v = "f32";
};

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open the prompt file");
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  CORELM_CHECK(!prompts.empty(), ValueError, path, ": no prompts (one prompt per non-empty line)");
  return prompts;
}

// --stop values may spell newlines and tabs as \n and \t (a literal backslash is \\).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char c = s[++i];
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
    if (c != 'n' && c != 't' && c != 'r' && c != '\\') out.insert(out.size() - 1, 1, '\\');
  }
  return out;
}

void print_stats(const infer::GenerationResult& r, size_t prompts, int64_t generated) {
  std::fprintf(stderr, "[%zu prompt%s] prefill: %.1f tok/s (%.3f s)  decode: %.1f tok/s (%.3f s, %lld tokens)%s%s\n",
               prompts, prompts == 1 ? "" : "s", r.prefill_tok_s, r.prefill_seconds, r.decode_tok_s, r.decode_seconds,
               static_cast<long long>(generated), prompts == 1 ? "  finish: " : "",
               prompts == 1 ? r.finish_reason.c_str() : "");
}

void run(const GenerateArgs& a) {
  CORELM_CHECK(a.prompt_given != !a.prompt_file.empty(), ValueError, "give exactly one of --prompt and --prompt-file");
  CORELM_CHECK(a.truncate == "none" || a.truncate == "left", ValueError, "--truncate must be 'left' or 'none' (got '",
               a.truncate, "')");
  CORELM_CHECK(a.batch_size >= 1, ValueError, "--batch-size must be >= 1 (got ", a.batch_size, ")");
  CORELM_CHECK(a.threads >= 1 && a.threads <= kMaxThreads, ValueError, "--threads must be in [1, ", kMaxThreads,
               "] (got ", a.threads, ")");
  set_num_threads(a.threads);

  infer::GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.sampling.greedy = a.greedy;
  o.sampling.temperature = a.temperature;
  o.sampling.top_k = a.top_k;
  o.sampling.top_p = a.top_p;
  o.sampling.min_p = a.min_p;
  o.sampling.repetition_penalty = a.repetition_penalty;
  o.sampling.no_repeat_ngram_size = a.no_repeat_ngram;
  o.sampling.validate();  // before the (slower) model load
  o.seed = a.seed;
  for (const auto& s : a.stop) o.stop.push_back(unescape(s));
  o.stop_at_eos = !a.ignore_eos;
  o.add_special = !a.no_special;
  o.truncate = a.truncate == "left" ? infer::Truncate::Left : infer::Truncate::None;

  std::vector<std::string> prompts = a.prompt_file.empty() ? std::vector<std::string>{a.prompt} : read_prompts(a.prompt_file);
  model::LoadOptions load_options;
  load_options.tokenizer_path = a.tokenizer;
  load_options.strict = a.strict;
  model::Checkpoint checkpoint = model::load_model(a.model, load_options);
  for (const auto& w : checkpoint.warnings) std::fprintf(stderr, "corelm: warning: %s\n", w.c_str());
  model::LoadedModel& m = checkpoint.model;
  // generation_config.json may list several eos ids (chat models end turns on more than one).
  for (int64_t id : checkpoint.eos_ids) o.eos_ids.push_back(static_cast<TokenId>(id));
  const model::Precision precision = model::parse_precision(a.precision);
  if (precision != model::Precision::F32) m.decoder.prepare_inference(precision);
  m.decoder.set_kv_cache_types(parse_kv_cache_flags(a.cache_type_k, a.cache_type_v));
  infer::TextGenerator gen(m.decoder, *m.tokenizer);

  const bool stream = prompts.size() == 1 && !a.json;
  infer::StreamCallback on_text;
  if (stream)
    on_text = [](size_t, std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  // Batches of --batch-size prompts bound the KV cache (prompt + max new tokens per prompt).
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(a.batch_size)) {
    const size_t last = std::min(prompts.size(), first + static_cast<size_t>(a.batch_size));
    std::vector<std::string> batch(prompts.begin() + first, prompts.begin() + last);
    std::vector<infer::GenerationResult> results = gen.generate(batch, o, on_text);
    int64_t generated = 0;
    for (const auto& r : results) generated += static_cast<int64_t>(r.tokens.size());
    for (size_t k = 0; k < results.size(); ++k) {
      const auto& r = results[k];
      const size_t i = first + k;
      if (r.truncated)
        std::fprintf(stderr, "corelm: warning: prompt %zu truncated to its last %lld tokens\n", i,
                     static_cast<long long>(r.prompt_tokens));
      if (a.json) {
        nlohmann::json j = {{"text", r.text},
                            {"tokens", r.tokens},
                            {"finish_reason", r.finish_reason},
                            {"prompt_tokens", r.prompt_tokens},
                            {"prefill_tok_s", r.prefill_tok_s},
                            {"decode_tok_s", r.decode_tok_s}};
        std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      } else if (!stream) {
        std::cout << "[" << i << "] " << r.text << "\n";
      }
    }
    if (stream) std::cout << "\n";
    std::cout.flush();
    print_stats(results.front(), results.size(), generated);
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* c = root.add_subcommand("generate", "Generate text from a model directory (streams to stdout)");
  c->add_option("--model", args->model, "model directory / Hugging Face folder, .gguf, llama2.c .bin (with --tokenizer) "
                                       "or .safetensors with config.json beside it")->required();
  c->add_option("--tokenizer", args->tokenizer, "tokenizer file or directory (tokenizer.json, tokenizer.model, llama2.c "
                                                "tokenizer.bin); default: the checkpoint's own");
  c->add_flag("--strict,!--no-strict", args->strict, "missing/unexpected tensors are an error (default) or a warning");
  CLI::Option* prompt = c->add_option("--prompt", args->prompt,
                                      "the prompt text (\"\" starts from the BOS token alone, or EOS where the tokenizer "
                                      "has no BOS)");
  c->add_option("--prompt-file", args->prompt_file, "one prompt per line, generated together in one batch");
  c->add_option("-n,--max-new-tokens", args->max_new_tokens, "tokens to generate at most")->capture_default_str();
  c->add_flag("--greedy", args->greedy, "argmax decoding (same as --temperature 0)");
  c->add_option("--temperature", args->temperature,
                "softmax temperature, >= 0; below 1e-5 (0 included) means greedy")
      ->capture_default_str();
  c->add_option("--top-k", args->top_k, "keep the k most likely tokens (0: off)")->capture_default_str();
  c->add_option("--top-p", args->top_p, "nucleus sampling: smallest set with probability >= p (1: off)")->capture_default_str();
  c->add_option("--min-p", args->min_p, "drop tokens with p < min_p * p_max (0: off)")->capture_default_str();
  c->add_option("--repetition-penalty", args->repetition_penalty,
                "divide positive / multiply negative logits of tokens already seen (1: off)")
      ->capture_default_str();
  c->add_option("--no-repeat-ngram", args->no_repeat_ngram, "never repeat an n-gram of this size (0: off)")->capture_default_str();
  c->add_option("--seed", args->seed, "sampling seed (each prompt samples from its own generator)")->capture_default_str();
  c->add_option("--stop", args->stop, "stop string (repeatable; \\n and \\t allowed); it is not included in the output");
  c->add_flag("--ignore-eos", args->ignore_eos, "keep generating past the end-of-sequence token");
  c->add_flag("--no-special", args->no_special, "do not add BOS/EOS to the prompt as the tokenizer configures");
  c->add_option("--truncate", args->truncate, "left: keep the last tokens of a prompt longer than the context "
                                              "(default: error)")->capture_default_str();
  c->add_option("--precision", args->precision,
                "bf16 (fast path, default), int8 (int8 weights+activations), q4 (4-bit weights, int8 head) or f32 (reference)")
      ->check(CLI::IsMember(model::precision_names()))
      ->capture_default_str();
  add_kv_cache_flags(c, args->cache_type_k, args->cache_type_v);
  c->add_option("--threads", args->threads, "compute threads, 1 to " + std::to_string(kMaxThreads))->capture_default_str();
  c->add_option("--batch-size", args->batch_size, "prompts of --prompt-file generated together")->capture_default_str();
  c->add_flag("--json", args->json, "one JSON object per prompt: text, tokens, finish_reason, prefill_tok_s, decode_tok_s");
  c->callback([args, prompt] {
    args->prompt_given = prompt->count() > 0;
    run(*args);
  });
});

}  // namespace
}  // namespace corelm::cli
