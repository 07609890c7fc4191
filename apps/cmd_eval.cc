// corelm eval: mean loss and perplexity of a model directory over a whole text or token file
// (non-overlapping windows: every token after the first is predicted exactly once).
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "kv_cache_flags.h"
#include <cstdio>

#include "corelm/model_loader.h"
#include "corelm/thread_pool.h"
#include "corelm/train.h"

namespace corelm::cli {
namespace {

struct EvalArgs {
  std::string model, data;
  std::string tokenizer;  // --tokenizer: overrides / supplies the checkpoint's
  bool strict = true;
  int64_t batch = 4, seq = 0;
  int threads = 1;
  bool json = false;
  std::string precision = "bf16";  // f32: the reference path
  std::string cache_type_k = "f32", cache_type_v = "f32";
};

void run(const EvalArgs& a) {
  set_num_threads(a.threads);
  model::LoadOptions load_options;
  load_options.tokenizer_path = a.tokenizer;
  load_options.strict = a.strict;
  model::Checkpoint checkpoint = model::load_model(a.model, load_options);
  for (const auto& w : checkpoint.warnings) std::fprintf(stderr, "corelm: warning: %s\n", w.c_str());
  model::LoadedModel& m = checkpoint.model;
  const model::Precision precision = model::parse_precision(a.precision);
  const model::KVCacheTypes kv = parse_kv_cache_flags(a.cache_type_k, a.cache_type_v);
  // The f32 reference scores whole windows with op attention and keeps no cache, so a cache
  // type would silently do nothing there.
  CORELM_CHECK(kv.all_f32() || precision != model::Precision::F32, ValueError,
               "--cache-type-k/--cache-type-v apply to the fast path (--precision bf16 or int8); "
               "--precision f32 scores without a KV cache");
  if (precision != model::Precision::F32) m.decoder.prepare_inference(precision);
  m.decoder.set_kv_cache_types(kv);
  const bool bin = a.data.size() > 4 && a.data.ends_with(".bin");
  train::TokenDataset data =
      bin ? train::TokenDataset::open(a.data) : train::TokenDataset::from_text_files(*m.tokenizer, {a.data}, a.threads);
  const train::EvalResult r = train::evaluate_dataset(m.decoder, data, train::EvalOptions{a.seq, a.batch});
  const double ppl = std::exp(r.mean_loss);
  if (a.json) {
    nlohmann::ordered_json j{{"mean_loss", r.mean_loss}, {"perplexity", ppl}, {"tokens", r.tokens}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "mean loss " << r.mean_loss << " nats/token, perplexity " << ppl << " over " << r.tokens
              << " tokens\n";
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* c = root.add_subcommand("eval", "Mean loss and perplexity of a model over a text or token file");
  c->add_option("--model", a->model, "model directory / Hugging Face folder, .gguf, llama2.c .bin (with --tokenizer) "
                                    "or .safetensors with config.json beside it")->required();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file or directory (default: the checkpoint's own)");
  c->add_flag("--strict,!--no-strict", a->strict, "missing/unexpected tensors are an error (default) or a warning");
  c->add_option("--data", a->data, "text file, or token file FILE.bin (+ FILE.bin.json)")->required();
  c->add_option("--seq", a->seq, "window length, 1 to the model context (default 0: the model context)");
  c->add_option("--batch", a->batch, "windows per forward")->capture_default_str();
  c->add_option("--precision", a->precision,
                "bf16 (fast path, default), int8 (int8 weights+activations), q4 (4-bit weights, int8 head) or f32 (reference)")
      ->check(CLI::IsMember(model::precision_names()))
      ->capture_default_str();
  add_kv_cache_flags(c, a->cache_type_k, a->cache_type_v);
  c->add_option("--threads", a->threads, "threads")->capture_default_str();
  c->add_flag("--json", a->json, "one JSON object on stdout");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace corelm::cli
