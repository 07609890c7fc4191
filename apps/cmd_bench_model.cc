// corelm bench model: one-core model throughput on random bf16-rounded weights (no files needed).
// Headline figures: scored tokens/s (prefill without the LM head, as classification scoring
// runs), batched and batch-1 generated tokens/s (decode with the full LM head), training
// tokens/s through the real trainer; plus an optional llama-bench-style grid (pp N / tg N by
// batch and context depth). Every figure: one warm-up run, then repeats for >= --seconds.
// The llama-bench matrix (--repetitions, --cache-type-k/-v, --kv-budget; include/corelm/bench_matrix.h):
// tests "pp512", "tg128 @ d4096", ... at batch 1, each repeated N times (avg_ts, stddev_ts,
// samples_ts), with the KV memory at each depth and the largest context a memory budget holds.
#include <optional>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "command_registry.h"
#include "corelm/autograd.h"
#include "corelm/bench_matrix.h"
#include "corelm/error.h"
#include "corelm/isa.h"
#include "corelm/model.h"
#include "corelm/model_loader.h"
#include "corelm/utf8.h"
#include "corelm/thread_pool.h"
#include "corelm/autocast.h"
#include "corelm/train.h"
#include "train/sampled_softmax.h"

namespace corelm::cli {
namespace {

struct BenchModelArgs {
  std::string preset = "tiny", precision = "bf16", train_compute_dtype = "f32";
  // A model file or directory (GGUF, HF directory, safetensors, llama2.c) whose weights are measured
  // instead of a preset's random ones: the same weights another engine's bench reads.
  std::string model_path;
  int threads = 1;
  bool json = false, grid = false, no_train = false, pin_threads = false;
  std::vector<std::string> only;  // empty: every figure
  bool no_headline = false;
  bool wants(const std::string& figure) const {
    if (no_headline) return false;
    if (no_train && (figure == "train" || figure == "train_sampled")) return false;
    return only.empty() || std::find(only.begin(), only.end(), figure) != only.end();
  }
  double seconds = 1.0;
  uint64_t seed = 1;
  int64_t score_batch = 16, score_seq = 256, gen_batch = 16, gen_steps = 128;
  int64_t train_batch = 8, train_seq = 128, train_steps = 4;
  std::vector<int64_t> pp{512}, tg{128};
  std::vector<int64_t> batch{1, 16, 32}, depth{0};
  // The llama-bench matrix: on when any of its flags is given (then the headline figures run only
  // when --only names them).
  bool matrix = false;
  int repetitions = 5;
  std::string cache_type_k = "f32", cache_type_v = "f32";
  int64_t kv_budget = -1;  // bytes; < 0: not asked
};

using Clock = std::chrono::steady_clock;

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Units per second of wall time and of process CPU time (on a shared, oversubscribed machine the
// wall figure includes time spent waiting for a core; with 1 thread the CPU figure does not).
struct Rate {
  double wall = 0, cpu = 0;
};

// Runs fn once to warm up, then until `min_seconds` have passed (at least twice), timing only
// the repeats. fn returns the units of work it processed.
template <typename Fn>
Rate rate(double min_seconds, Fn fn) {
  fn();
  double total = 0, units = 0;
  const double cpu0 = process_cpu_seconds();
  for (int runs = 0; runs < 2 || total < min_seconds; ++runs) {
    const auto t0 = Clock::now();
    units += static_cast<double>(fn());
    total += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return {units / total, units / (process_cpu_seconds() - cpu0)};
}

std::vector<int64_t> iota_rows(int64_t n) {
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = i;
  return rows;
}

Tensor random_ids(int64_t B, int64_t T, int64_t vocab, Generator& gen) {
  std::vector<int64_t> ids(static_cast<size_t>(B * T));
  for (auto& id : ids) id = static_cast<int64_t>(gen.below(static_cast<uint64_t>(vocab)));
  return Tensor::from_vector(ids, {B, T});
}

// Fills every row of `cache` to `depth` tokens (untimed context for the grid).
void fill_depth(const model::Decoder& d, model::KVCache& cache, int64_t depth, Generator& gen) {
  cache.reset();
  if (depth > 0)
    d.forward_cached(random_ids(cache.batch(), depth, d.config().vocab_size, gen), cache, iota_rows(cache.batch()),
                     model::Logits::None);
}

// Puts every row back at `depth` before a timed repetition. A full KV cache just forgets the
// positions after it; sliding-window rings and linear-attention states cannot be rewound, so such
// a cache is restored from a copy taken at `depth` (O(window + state) bytes, inside the timing).
void back_to_depth(model::KVCache& cache, const model::KVCache* saved, int64_t depth) {
  for (int64_t r = 0; r < cache.batch(); ++r) {
    if (saved && depth > 0) cache.copy_from(*saved, r, r, depth);
    else cache.set_length(r, depth);
  }
}

// Prefill of B x T tokens at `depth`, logits as asked; tokens/s.
Rate prefill_rate(const model::Decoder& d, int64_t B, int64_t T, int64_t depth, model::Logits logits, double secs,
                    Generator& gen) {
  model::KVCache cache = d.make_cache(B, depth + T);
  fill_depth(d, cache, depth, gen);
  std::optional<model::KVCache> saved;
  if (!cache.supports_prefix_blocks()) {  // a deep copy (tensors share storage when copied)
    saved.emplace(d.make_cache(B, depth + T));
    for (int64_t r = 0; r < B && depth > 0; ++r) saved->copy_from(cache, r, r, depth);
  }
  const Tensor ids = random_ids(B, T, d.config().vocab_size, gen);
  const auto rows = iota_rows(B);
  return rate(secs, [&] {
    back_to_depth(cache, saved ? &*saved : nullptr, depth);
    d.forward_cached(ids, cache, rows, logits);
    return B * T;
  });
}

// `steps` decode steps of B rows from `depth`, full LM head; generated tokens/s.
Rate decode_rate(const model::Decoder& d, int64_t B, int64_t steps, int64_t depth, double secs, Generator& gen) {
  model::KVCache cache = d.make_cache(B, depth + steps);
  fill_depth(d, cache, depth, gen);
  std::optional<model::KVCache> saved;
  if (!cache.supports_prefix_blocks()) {  // a deep copy (tensors share storage when copied)
    saved.emplace(d.make_cache(B, depth + steps));
    for (int64_t r = 0; r < B && depth > 0; ++r) saved->copy_from(cache, r, r, depth);
  }
  const Tensor ids = random_ids(B, 1, d.config().vocab_size, gen);
  const auto rows = iota_rows(B);
  return rate(secs, [&] {
    back_to_depth(cache, saved ? &*saved : nullptr, depth);
    for (int64_t s = 0; s < steps; ++s) d.forward_cached(ids, cache, rows, model::Logits::All);
    return B * steps;
  });
}

// Training steps through train::train (AdamW, clipping, fused LM head + cross-entropy): `loss` is
// "full" or "sampled" (the trainer's defaults: 1024 negatives per step from the unigram counts of
// the same random tokens, floor 32; uniform random tokens put ~1000 distinct targets in each batch,
// more than real text, so the sampled figure is on the pessimistic side).
double train_rate(const model::ModelConfig& config, const BenchModelArgs& a, const std::string& loss) {
  model::Decoder d(config);
  d.init_weights(a.seed);
  Generator gen(a.seed + 7);
  std::vector<TokenId> ids(static_cast<size_t>(a.train_batch * (a.train_seq + 1) * 16));
  for (auto& id : ids) id = static_cast<TokenId>(gen.below(static_cast<uint64_t>(config.vocab_size)));
  train::TokenDataset data = train::TokenDataset::from_ids(std::move(ids));
  const std::vector<int64_t> counts = train::count_tokens(data, 0, data.size(), config.vocab_size);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("corelm-bench-train-" + std::to_string(::getpid()))).string();
  train::TrainOptions o;
  o.out_dir = dir;
  o.steps = a.train_steps + 1;  // the first step warms up and is not counted below
  o.batch = a.train_batch;
  o.seq = a.train_seq;
  o.sample_tokens = 0;
  o.progress = false;
  o.seed = a.seed;
  o.schedule.warmup = 0;
  o.loss = loss;
  o.compute_dtype = a.train_compute_dtype;
  if (loss == "sampled") o.unigram_counts = counts;
  train::WindowSampler sampler(data, 0, data.size(), a.seed);
  train::TrainResult r;
  try {
    // One step first so allocation and page faults are not timed, then the measured run.
    train::TrainOptions warm = o;
    warm.steps = 1;
    train::train(d, sampler, nullptr, nullptr, "", warm);
    std::filesystem::remove_all(dir);
    r = train::train(d, sampler, nullptr, nullptr, "", o);
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  std::filesystem::remove_all(dir);
  return r.tokens_per_s;
}

// The llama-bench matrix into r: "type_k"/"type_v", "context", "tests" (one object per test, llama-bench's
// field names), "kv_memory" (bytes of one sequence's cache at each depth) and, with --kv-budget,
// "kv_budget" (the largest context whose cache fits).
void add_matrix(const model::Decoder& d, const BenchModelArgs& a, nlohmann::ordered_json& r) {
  infer::BenchMatrixOptions o;
  o.pp = a.pp;
  o.tg = a.tg;
  o.depth = a.depth;
  o.repetitions = a.repetitions;
  o.seed = a.seed + 2;
  const std::string type_k = model::kv_cache_type_name(d.kv_cache_types().k);
  const std::string type_v = model::kv_cache_type_name(d.kv_cache_types().v);
  r["type_k"] = type_k;
  r["type_v"] = type_v;
  r["context"] = d.config().max_position_embeddings;
  nlohmann::ordered_json tests = nlohmann::ordered_json::array();
  for (const infer::BenchTest& t : infer::run_bench_matrix(d, o))
    tests.push_back({{"test", t.name}, {"n_prompt", t.n_prompt}, {"n_gen", t.n_gen}, {"n_depth", t.n_depth},
                     {"n_threads", a.threads}, {"type_k", type_k}, {"type_v", type_v}, {"avg_ts", t.avg_ts},
                     {"stddev_ts", t.stddev_ts}, {"samples_ts", t.samples_ts}, {"kv_bytes", t.kv_bytes}});
  r["tests"] = tests;
  nlohmann::ordered_json memory = nlohmann::ordered_json::array();
  for (int64_t depth : a.depth) memory.push_back({{"n_depth", depth}, {"bytes", infer::kv_cache_bytes(d, depth)}});
  r["kv_memory"] = memory;
  if (a.kv_budget >= 0)
    r["kv_budget"] = {{"bytes", a.kv_budget},
                      {"bytes_per_token", infer::kv_cache_bytes(d, 1) - infer::kv_cache_bytes(d, 0)},
                      {"fixed_bytes", infer::kv_cache_bytes(d, 0)},  // rings and states: any length
                      {"max_context", infer::max_context_for_kv_budget(d, a.kv_budget)}};
}

void print_matrix(const nlohmann::ordered_json& r) {
  std::printf("\n| test | type_k | type_v | KV MiB | t/s |\n|---|---|---|---:|---:|\n");
  for (const auto& t : r["tests"])
    std::printf("| %s | %s | %s | %.2f | %.2f ± %.2f |\n", t["test"].get<std::string>().c_str(),
                t["type_k"].get<std::string>().c_str(), t["type_v"].get<std::string>().c_str(),
                t["kv_bytes"].get<double>() / (1 << 20), t["avg_ts"].get<double>(), t["stddev_ts"].get<double>());
  if (r.contains("kv_budget")) {
    const long long max_context = r["kv_budget"]["max_context"].get<int64_t>();
    if (max_context < 0)
      std::printf("KV budget %lld bytes: any context (the cache does not grow with it: %lld bytes per sequence)\n",
                  static_cast<long long>(r["kv_budget"]["bytes"].get<int64_t>()),
                  static_cast<long long>(r["kv_memory"][0]["bytes"].get<int64_t>()));
    else
      std::printf("KV budget %lld bytes: largest context %lld tokens (%.1f bytes/token)\n",
                  static_cast<long long>(r["kv_budget"]["bytes"].get<int64_t>()), max_context,
                  r["kv_budget"]["bytes_per_token"].get<double>());
  }
}

void run(const BenchModelArgs& a) {
  CORELM_CHECK(a.threads >= 1, ValueError, "bench model: --threads must be >= 1");
  if (a.pin_threads) set_pin_threads(true);  // before the workers start, so each starts pinned
  set_num_threads(a.threads);
  // The matrix's deepest test (depth + tokens); 0 without the matrix.
  int64_t need = 0;
  if (a.matrix)
    for (int64_t depth : a.depth)
      for (const auto* list : {&a.pp, &a.tg})
        for (int64_t n : *list) need = std::max(need, depth + n);
  std::optional<model::Checkpoint> checkpoint;
  int64_t trained_context = -1;  // the file's own context when the matrix extends it
  if (!a.model_path.empty()) {
    model::LoadOptions load_options;
    load_options.require_tokenizer = false;  // the bench feeds random token ids
    // Strict loading: a weight mismatch is an error, so the loader's warnings can only be about the
    // tokenizer or chat template, which the bench never uses; they are not printed.
    checkpoint.emplace(model::load_model(a.model_path, load_options));
  }
  model::ModelConfig config = checkpoint ? checkpoint->model.decoder.config() : model::ModelConfig::preset(a.preset);
  // RoPE runs at any position, so (as llama-bench's -d does) the matrix's deepest test sets the
  // context when it is above the model's; a file's own context is reported beside it.
  if (need > config.max_position_embeddings) {
    if (checkpoint) trained_context = config.max_position_embeddings;
    config.max_position_embeddings = need;
  }
  model::Decoder d(config);
  d.set_kv_cache_types({model::parse_kv_cache_type(a.cache_type_k), model::parse_kv_cache_type(a.cache_type_v)});
  {
    autograd::NoGradGuard no_grad;
    if (checkpoint) {
      // The file's parameters (f32 as loaded), copied into the decoder sized for the matrix.
      const auto& loaded = checkpoint->model.decoder.named_parameters();
      const auto& mine = d.named_parameters();
      CORELM_CHECK(loaded.size() == mine.size(), ValueError, "bench model: ", a.model_path,
                   ": parameter count differs from its config's");
      for (size_t i = 0; i < mine.size(); ++i) const_cast<Tensor&>(mine[i].second).copy_(loaded[i].second);
      checkpoint.reset();  // free the loaded copy before measuring
    } else {
      // Random weights rounded to bf16, so the f32 and bf16 paths see the same model.
      d.init_weights(a.seed);
      for (const auto& [name, t] : d.named_parameters()) const_cast<Tensor&>(t).copy_(t.to(DType::BF16));
    }
  }
  const model::Precision precision = model::parse_precision(a.precision);
  d.prepare_inference(precision);
  Generator gen(a.seed + 1);
  Rate scored, generated, b1;
  {
    autograd::NoGradGuard no_grad;
    if (a.wants("scored")) scored = prefill_rate(d, a.score_batch, a.score_seq, 0, model::Logits::None, a.seconds, gen);
    if (a.wants("generated")) generated = decode_rate(d, a.gen_batch, a.gen_steps, 0, a.seconds, gen);
    if (a.wants("decode_b1")) b1 = decode_rate(d, 1, a.gen_steps, 0, a.seconds, gen);
  }
  const double trained = a.wants("train") ? train_rate(config, a, "full") : 0.0;
  const double trained_sampled = a.wants("train_sampled") ? train_rate(config, a, "sampled") : 0.0;
  // The kernel the bf16 training products ran on (chosen by measured peaks; CORELM_BF16_GEMM).
  const bool bf16_trained = a.train_compute_dtype == "bf16" && (a.wants("train") || a.wants("train_sampled"));
  const std::string bf16_kernel = bf16_trained ? ops::bf16_gemm_kernel() : "";
  // A figure that was not measured is null in the JSON and "-" in the table.
  const auto figure = [&](const char* name, double v) {
    return a.wants(name) ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
  };

  const double flops_per_token = 2.0 * static_cast<double>(config.num_parameters(false));
  nlohmann::ordered_json r{{"preset", a.model_path.empty() ? nlohmann::ordered_json(a.preset) : nlohmann::ordered_json()},
                           {"model", a.model_path.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(escape_invalid_utf8(a.model_path))},
                           {"trained_context", trained_context < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(trained_context)},
                           {"isa", isa_name(active_isa())},
                           {"threads", a.threads},
                           {"pin_threads", pin_threads()},
                           {"precision", model::precision_name(precision)},
                           {"scored_tok_s", figure("scored", scored.wall)},
                           {"scored_shape", {a.score_batch, a.score_seq}},
                           {"generated_tok_s", figure("generated", generated.wall)},
                           {"generated_batch", a.gen_batch},
                           {"generated_steps", a.gen_steps},
                           {"decode_b1_tok_s", figure("decode_b1", b1.wall)},
                           {"train_tok_s", figure("train", trained)},
                           {"train_sampled_tok_s", figure("train_sampled", trained_sampled)},
                           {"train_sampled_negatives", train::TrainOptions{}.sampled_negatives},
                           {"train_shape", {a.train_batch, a.train_seq}},
                           {"train_compute_dtype", a.train_compute_dtype},
                           {"train_bf16_kernel", bf16_kernel.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(bf16_kernel)},
                           {"train_bf16_kernel_source", bf16_kernel.empty() ? nlohmann::ordered_json()
                                                                            : nlohmann::ordered_json(ops::bf16_gemm_kernel_source())},
                           {"cpu_time_tok_s",
                            {{"scored", figure("scored", scored.cpu)},
                             {"generated", figure("generated", generated.cpu)},
                             {"decode_b1", figure("decode_b1", b1.cpu)}}},
                           {"params", config.num_parameters(true)},
                           {"params_non_embedding", config.num_parameters(false)},
                           {"flops_per_token_no_head", flops_per_token},
                           {"lm_head_flops_per_token", 2.0 * double(config.vocab_size * config.hidden_size)},
                           {"config", config.to_json()}};
  if (a.grid && !a.matrix) {
    autograd::NoGradGuard no_grad;
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (int64_t depth : a.depth)
      for (int64_t b : a.batch)
        for (size_t i = 0; i < std::max(a.pp.size(), a.tg.size()); ++i) {
          if (i < a.pp.size())
            rows.push_back({{"test", "pp" + std::to_string(a.pp[i])}, {"batch", b}, {"depth", depth},
                            {"tok_s", prefill_rate(d, b, a.pp[i], depth, model::Logits::Last, a.seconds, gen).wall}});
          if (i < a.tg.size())
            rows.push_back({{"test", "tg" + std::to_string(a.tg[i])}, {"batch", b}, {"depth", depth},
                            {"tok_s", decode_rate(d, b, a.tg[i], depth, a.seconds, gen).wall}});
        }
    r["grid"] = rows;
  }
  if (a.matrix) add_matrix(d, a, r);
  if (a.json) {
    std::cout << r.dump() << "\n";
    return;
  }
  std::printf("model %s (%lld params), %s, isa %s, %d thread(s)\n",
              a.model_path.empty() ? a.preset.c_str() : a.model_path.c_str(),
              static_cast<long long>(config.num_parameters(true)), model::precision_name(precision),
              isa_name(active_isa()), a.threads);
  if (bf16_trained) std::printf("training products in bf16 on the %s kernel\n", bf16_kernel.c_str());
  bool any_figure = false;
  for (const char* f : {"scored", "generated", "decode_b1", "train", "train_sampled"}) any_figure |= a.wants(f);
  if (any_figure) std::printf("| measurement | shape | tok/s |\n|---|---|---:|\n");
  if (a.wants("scored"))
    std::printf("| scored (prefill, no LM head) | %lld x %lld | %.0f |\n", static_cast<long long>(a.score_batch),
                static_cast<long long>(a.score_seq), scored.wall);
  if (a.wants("generated"))
    std::printf("| generated (batched decode, full LM head) | B=%lld, %lld steps | %.0f |\n",
                static_cast<long long>(a.gen_batch), static_cast<long long>(a.gen_steps), generated.wall);
  if (a.wants("decode_b1"))
    std::printf("| decode batch 1 | %lld steps | %.0f |\n", static_cast<long long>(a.gen_steps), b1.wall);
  if (a.wants("train"))
    std::printf("| train (AdamW, full softmax) | %lld x %lld | %.0f |\n", static_cast<long long>(a.train_batch),
                static_cast<long long>(a.train_seq), trained);
  if (a.wants("train_sampled"))
    std::printf("| train (AdamW, sampled softmax, %lld negatives) | %lld x %lld | %.0f |\n",
                static_cast<long long>(train::TrainOptions{}.sampled_negatives), static_cast<long long>(a.train_batch),
                static_cast<long long>(a.train_seq), trained_sampled);
  if (a.matrix) print_matrix(r);
  if (a.grid && !a.matrix) {
    std::printf("\n| test | batch | depth | tok/s |\n|---|---:|---:|---:|\n");
    for (const auto& row : r["grid"])
      std::printf("| %s | %lld | %lld | %.0f |\n", row["test"].get<std::string>().c_str(),
                  static_cast<long long>(row["batch"].get<int64_t>()), static_cast<long long>(row["depth"].get<int64_t>()),
                  row["tok_s"].get<double>());
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<BenchModelArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "Benchmarks (JSON with --json)");
  CLI::App* c = bench.add_subcommand("model", "Model tokens/s on random weights: scoring, decode, training, grid");
  c->add_option("--preset", a->preset, "model shape: tiny, small, smollm2-135m, hybrid")->capture_default_str();
  c->add_option("--model", a->model_path,
                 "measure this model file or directory (GGUF, HF dir, safetensors, llama2.c) instead of a preset's "
                 "random weights; no training figures");
  c->add_option("--threads", a->threads, "compute threads")->capture_default_str();
  c->add_option("--precision", a->precision,
                "bf16 (fast path, default), int8 (fast path, int8 weights+activations) or f32 (reference)")
      ->check(CLI::IsMember(model::precision_names()))
      ->capture_default_str();
  c->add_option("--seconds", a->seconds, "minimum measuring time per figure")->capture_default_str();
  c->add_option("--seed", a->seed, "weight seed")->capture_default_str();
  c->add_option("--gen-batch", a->gen_batch, "rows of the batched decode figure")->capture_default_str();
  c->add_option("--train-steps", a->train_steps, "timed training steps")->capture_default_str();
  c->add_flag("--no-train", a->no_train, "skip the training figures");
  c->add_option("--train-compute-dtype", a->train_compute_dtype,
                "matrix-product precision of the training figures: f32 or bf16 (train --compute-dtype)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  c->add_option("--only", a->only,
                "measure only these figures (e.g. for profiling): scored, generated, decode_b1, train, train_sampled")
      ->delimiter(',')
      ->check(CLI::IsMember({"scored", "generated", "decode_b1", "train", "train_sampled"}));
  c->add_flag("--pin-threads", a->pin_threads,
              "pin the calling thread and each worker to its own CPU of the allowed set (also CORELM_PIN_THREADS=1)");
  c->add_flag("--grid", a->grid, "also run the pp/tg grid (implied by --pp, --tg, --batch, --depth)");
  CLI::Option* pp = c->add_option("--pp", a->pp, "grid/matrix: prompt tokens per row (prefill, last-token logits), "
                                  "e.g. 512,4096")->delimiter(',')->capture_default_str();
  CLI::Option* tg = c->add_option("--tg", a->tg, "grid/matrix: generated tokens per row (decode, full LM head)")
                        ->delimiter(',')->capture_default_str();
  CLI::Option* batch = c->add_option("--batch", a->batch, "grid: batch sizes, e.g. 1,16,32")->delimiter(',');
  CLI::Option* depth = c->add_option("--depth", a->depth, "grid: context depths, e.g. 0,256")->delimiter(',');
  CLI::Option* reps = c->add_option("--repetitions,-r", a->repetitions,
                                    "matrix: timed runs per test (llama-bench tests pp/tg @ depth, batch 1)")
                          ->capture_default_str();
  CLI::Option* ctk = c->add_option("--cache-type-k", a->cache_type_k, "matrix: KV cache type of the keys (f32, bf16, "
                                   "f16, q8_0, q4_0, turbo4, turbo3)")->capture_default_str();
  CLI::Option* ctv = c->add_option("--cache-type-v", a->cache_type_v, "matrix: KV cache type of the values")
                         ->capture_default_str();
  CLI::Option* budget = c->add_option("--kv-budget", a->kv_budget,
                                      "matrix: report the largest context whose KV cache fits in BYTES");
  c->add_flag("--matrix", a->matrix, "run the llama-bench matrix (implied by --repetitions, --cache-type-*, --kv-budget)");
  c->add_flag("--json", a->json, "print one JSON object");
  c->callback([a, pp, tg, batch, depth, reps, ctk, ctv, budget] {
    if (reps->count() || ctk->count() || ctv->count() || budget->count()) a->matrix = true;
    if (pp->count() || tg->count() || batch->count() || depth->count()) a->grid = true;
    // The matrix replaces the headline figures unless --only names some.
    if (a->matrix && a->only.empty()) a->no_headline = true;
    if (!a->model_path.empty()) {
      // Training figures build a fresh model of the shape: they measure a preset, not a file.
      for (const auto& f : a->only)
        CORELM_CHECK(f != "train" && f != "train_sampled", ValueError,
                     "bench model: --only ", f, " measures a preset's training; it does not take --model");
      a->no_train = true;
    }
    run(*a);
  });
});

}  // namespace
}  // namespace corelm::cli
