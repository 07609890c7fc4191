// corelm perplexity: llama.cpp's perplexity method (chunks of --ctx tokens, BOS first, second half
// scored) over a text file, and its KL-divergence mode (--save-logits / --kl-base). The method
// lives in the library (include/corelm/perplexity.h); this file parses, calls it and prints.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/model_loader.h"
#include "corelm/perplexity.h"
#include "corelm/thread_pool.h"

namespace corelm::cli {
namespace {

struct PerplexityArgs {
  std::string model, file, tokenizer, precision = "bf16", save_logits, kl_base;
  std::string cache_type_k = "f32", cache_type_v = "f32";
  int64_t ctx = 512, chunks = -1, batch = 1;
  int threads = 1;
  bool json = false;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.is_open(), IOError, "perplexity: cannot open --file ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::ordered_json kld_json(const pipeline::KLDivergence& k) {
  return {{"ppl", k.ppl},
          {"ppl_stderr", k.ppl_stderr},
          {"base_ppl", k.base_ppl},
          {"base_ppl_stderr", k.base_ppl_stderr},
          {"delta_ppl", k.delta_ppl},
          {"delta_ppl_stderr", k.delta_ppl_stderr},
          {"delta_ln_ppl", k.delta_ln_ppl},
          {"delta_ln_ppl_stderr", k.delta_ln_ppl_stderr},
          {"nll_correlation", k.nll_correlation},
          {"mean_kld", k.mean_kld},
          {"mean_kld_stderr", k.mean_kld_stderr},
          {"max_kld", k.max_kld},
          {"p99_kld", k.p99_kld},
          {"median_kld", k.median_kld},
          {"same_top_pct", 100 * k.same_top},
          {"same_top_pct_stderr", 100 * k.same_top_stderr}};
}

void run(const PerplexityArgs& a) {
  set_num_threads(a.threads);
  model::LoadOptions load_options;
  load_options.tokenizer_path = a.tokenizer;
  model::Checkpoint checkpoint = model::load_model(a.model, load_options);
  for (const auto& w : checkpoint.warnings) std::fprintf(stderr, "corelm: warning: %s\n", w.c_str());
  model::LoadedModel& m = checkpoint.model;
  const model::Precision precision = model::parse_precision(a.precision);
  if (precision != model::Precision::F32) m.decoder.prepare_inference(precision);
  m.decoder.set_kv_cache_types({model::parse_kv_cache_type(a.cache_type_k), model::parse_kv_cache_type(a.cache_type_v)});

  const std::optional<TokenId> bos = pipeline::tokenizer_adds_bos(*m.tokenizer);
  const std::vector<TokenId> tokens = pipeline::perplexity_tokens(*m.tokenizer, read_text(a.file), bos);
  pipeline::PerplexityOptions o;
  o.ctx = a.ctx;
  o.chunks = a.chunks;
  o.batch = a.batch;
  o.save_logits = a.save_logits;
  o.kl_base = a.kl_base;
  const bool tty = ::isatty(STDERR_FILENO);
  o.progress = [&](const pipeline::PerplexityProgress& p) {
    const double cps = p.chunks_done / std::max(p.seconds, 1e-9);
    std::fprintf(stderr, "%s[perplexity] chunk %lld/%lld  %.2f chunks/s  %.0f tok/s  ETA %.0fs  ppl %.4f%s",
                 tty ? "\r" : "", static_cast<long long>(p.chunks_done), static_cast<long long>(p.chunks_total), cps,
                 cps * static_cast<double>(a.ctx), (p.chunks_total - p.chunks_done) / std::max(cps, 1e-9),
                 p.running_ppl, tty && p.chunks_done < p.chunks_total ? "   " : "\n");
  };
  const pipeline::PerplexityResult r = pipeline::perplexity(m.decoder, tokens, bos, o);

  if (a.json) {
    nlohmann::ordered_json running = nlohmann::ordered_json::array();
    for (size_t i = 0; i < r.running_ppl.size(); ++i)
      running.push_back({{"chunk", i + 1}, {"ppl", r.running_ppl[i]}, {"stderr", r.running_stderr[i]}});
    nlohmann::ordered_json j{{"model", a.model},
                             {"file", a.file},
                             {"precision", model::precision_name(precision)},
                             {"type_k", model::kv_cache_type_name(m.decoder.kv_cache_types().k)},
                             {"type_v", model::kv_cache_type_name(m.decoder.kv_cache_types().v)},
                             {"kv_bytes_per_token", m.decoder.make_cache(1, 1).bytes_per_token()},
                             {"threads", a.threads},
                             {"tokens", r.tokens},
                             {"ctx", r.ctx},
                             {"chunks", r.chunks},
                             {"scored", r.count},
                             {"bos", r.bos},
                             {"mean_nll", r.mean_nll},
                             {"ppl", r.ppl},
                             {"ppl_stderr", r.ppl_stderr},
                             {"seconds", r.seconds},
                             {"tokens_per_s", static_cast<double>(r.chunks * r.ctx) / std::max(r.seconds, 1e-9)},
                             {"running", running}};
    if (r.kld) j["kld"] = kld_json(*r.kld);
    std::cout << j.dump() << "\n";
    return;
  }
  for (size_t i = 0; i < r.running_ppl.size(); ++i) std::printf("[%zu]%.4f,", i + 1, r.running_ppl[i]);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f  (%lld chunks of %lld tokens, %lld scored, %.1f s)\n", r.ppl,
              r.ppl_stderr, static_cast<long long>(r.chunks), static_cast<long long>(r.ctx),
              static_cast<long long>(r.count), r.seconds);
  if (r.kld) {
    const auto& k = *r.kld;
    std::printf("PPL(Q)              %10.6f +/- %.6f\n", k.ppl, k.ppl_stderr);
    std::printf("PPL(base)           %10.6f +/- %.6f\n", k.base_ppl, k.base_ppl_stderr);
    std::printf("PPL(Q)-PPL(base)    %10.6f +/- %.6f (paired)\n", k.delta_ppl, k.delta_ppl_stderr);
    std::printf("ln(PPL(Q)/PPL(base)) %9.6f +/- %.6f (paired)\n", k.delta_ln_ppl, k.delta_ln_ppl_stderr);
    std::printf("mean KLD            %10.6f +/- %.6f\n", k.mean_kld, k.mean_kld_stderr);
    std::printf("max KLD             %10.6f\n99%% KLD             %10.6f\nmedian KLD          %10.6f\n", k.max_kld,
                k.p99_kld, k.median_kld);
    std::printf("same top token      %9.3f%% +/- %.3f%%\n", 100 * k.same_top, 100 * k.same_top_stderr);
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* c = root.add_subcommand(
      "perplexity", "Perplexity over a text file by llama.cpp's method (chunks of --ctx, second half scored); "
                    "KL divergence against saved log-probabilities");
  c->add_option("--model", a->model, "model directory / Hugging Face folder, .gguf, llama2.c .bin (with --tokenizer) "
                                    "or .safetensors with config.json beside it")->required();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file or directory (default: the checkpoint's own)");
  c->add_option("--file,-f", a->file, "text file (e.g. wikitext-2 wiki.test.raw)")->required();
  c->add_option("--ctx,-c", a->ctx, "tokens per chunk (n_ctx); the second half of each chunk is scored")
      ->capture_default_str();
  c->add_option("--chunks", a->chunks, "at most this many chunks (default: all)");
  c->add_option("--batch", a->batch, "chunks evaluated together (rows of one forward)")->capture_default_str();
  c->add_option("--threads,-t", a->threads, "threads")->capture_default_str();
  c->add_option("--precision", a->precision,
                "bf16 (fast path, default), int8 (int8 weights+activations), q4 (4-bit weights) or f32 (reference)")
      ->check(CLI::IsMember(model::precision_names()))
      ->capture_default_str();
  c->add_option("--cache-type-k", a->cache_type_k, "KV cache type of the keys: f32, bf16, f16, q8_0, q4_0, turbo4 or turbo3")
      ->capture_default_str();
  c->add_option("--cache-type-v", a->cache_type_v, "KV cache type of the values (the same names)")->capture_default_str();
  c->add_option("--save-logits", a->save_logits,
                "write the scored positions' log-probabilities (base file of a later --kl-base run)");
  c->add_option("--kl-base", a->kl_base, "compare against a --save-logits file: KL divergence, top-token agreement, "
                                        "paired delta-PPL");
  c->add_flag("--json", a->json, "one JSON object on stdout");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace corelm::cli
