// corelm bench pipeline: `corelm run classify` throughput on synthetic documents of a fixed token
// length (default: the `tiny` preset with random weights, 4 labels, 256-token documents). Builds
// the model directory and corpus in a scratch folder, runs the real pipeline, prints JSON.
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/model_dir.h"
#include "corelm/pipeline.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"
#include "corelm/utf8.h"

namespace corelm::cli {
namespace {
namespace fs = std::filesystem;

struct BenchPipelineArgs {
  std::string preset = "tiny", model, scratch, precision = "bf16";
  int64_t docs = 64, doc_tokens = 256, batch = 16, labels = 4;
  int threads = 1;
  bool keep = false;
};

std::string synthetic_words(std::mt19937& rng, int n) {
  static const char* w[] = {"market", "shares", "team", "season", "government", "election", "research",
                            "software", "company", "players", "minister", "scientists", "profit", "league",
                            "network", "officials", "quarter", "coach", "space", "data", "the", "of", "and",
                            "in", "to", "a", "on", "for", "with", "new", "after", "said"};
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += w[rng() % (sizeof(w) / sizeof(w[0]))];
  }
  return s;
}

void run(const BenchPipelineArgs& a) {
  const fs::path dir = a.scratch.empty() ? fs::temp_directory_path() / ("corelm_bench_pipeline_" + std::to_string(::getpid()))
                                         : fs::path(a.scratch);
  fs::create_directories(dir);
  std::mt19937 rng(1);
  std::string model_dir = a.model;
  if (model_dir.empty()) {
    // Random weights: throughput does not depend on what the model knows.
    model_dir = (dir / "model").string();
    fs::create_directories(model_dir);
    {
      std::ofstream t(dir / "tok.txt");
      for (int i = 0; i < 2000; ++i) t << synthetic_words(rng, 40) << "\n";
    }
    BpeTrainOptions bpe;
    bpe.vocab_size = 2048;
    train_bpe({(dir / "tok.txt").string()}, bpe, model_dir + "/tokenizer.json");
    model::ModelConfig cfg = model::ModelConfig::preset(a.preset);
    model::Decoder d(cfg);
    d.init_weights(1);
    model::save_model_dir(model_dir, d);
  }
  auto tok = Tokenizer::load(model_dir + "/tokenizer.json");
  {
    // Written whole (temp name + rename): a --scratch folder may hold a corpus of an earlier run.
    std::string in;
    for (int64_t i = 0; i < a.docs; ++i) {
      std::vector<TokenId> ids = tok->encode(synthetic_words(rng, static_cast<int>(a.doc_tokens * 2)));
      ids.resize(static_cast<size_t>(a.doc_tokens));
      // Cut ids may end inside a multi-byte character: replace it rather than fail the dump.
      in += nlohmann::json{{"text", tok->decode(ids)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
            "\n";
    }
    write_file_atomic((dir / "docs.jsonl").string(), in);
  }
  pipeline::RunOptions o;
  o.model = model_dir;
  o.inputs = {(dir / "docs.jsonl").string()};
  o.out = (dir / "out").string();
  fs::remove_all(o.out);
  o.batch = a.batch;
  o.precision = a.precision;
  o.threads = a.threads;
  o.task.kind = pipeline::TaskKind::Classify;
  const std::vector<std::string> names{"World", "Sports", "Business", "Sci/Tech", "Health", "Arts", "Travel", "Food"};
  CORELM_CHECK(a.labels >= 2 && a.labels <= static_cast<int64_t>(names.size()), ValueError, "--labels: 2..8");
  o.task.labels.assign(names.begin(), names.begin() + a.labels);
  o.task.max_context = 0;
  // CPU time as well as wall time: on a shared machine the CPU figure is the stable one. It
  // includes loading the model and planning, so it slightly understates the steady state.
  timespec c0{}, c1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  const pipeline::RunSummary s = pipeline::run(o);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  const double cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
  nlohmann::ordered_json j{{"bench", "pipeline_classify"},
                           {"model", a.model.empty() ? a.preset + " (random weights)" : escape_invalid_utf8(a.model)},
                           {"docs", s.records},
                           {"doc_tokens", a.doc_tokens},
                           {"labels", a.labels},
                           {"batch", a.batch},
                           {"precision", a.precision},
                           {"threads", a.threads},
                           {"input_tokens", s.input_tokens},
                           {"seconds", s.seconds},
                           {"docs_per_s", s.seconds > 0 ? s.records / s.seconds : 0.0},
                           {"input_tokens_per_s", s.tokens_per_s},
                           {"cpu_seconds", cpu},
                           {"input_tokens_per_cpu_s", cpu > 0 ? s.input_tokens / cpu : 0.0}};
  std::cout << j.dump() << "\n";
  if (!a.keep && a.scratch.empty()) fs::remove_all(dir);
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<BenchPipelineArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "Benchmarks (JSON with --json)");
  CLI::App* c = bench.add_subcommand("pipeline", "corelm run classify throughput (documents/s, input tokens/s; JSON)");
  c->add_option("--preset", a->preset, "model shape with random weights")->capture_default_str();
  c->add_option("--model", a->model, "a model directory instead of a random preset");
  c->add_option("--docs", a->docs, "documents")->capture_default_str();
  c->add_option("--doc-tokens", a->doc_tokens, "tokens per document")->capture_default_str();
  c->add_option("--labels", a->labels, "number of labels (2..8)")->capture_default_str();
  c->add_option("--batch", a->batch, "documents per forward")->capture_default_str();
  c->add_option("--threads", a->threads, "threads")->capture_default_str();
  c->add_option("--precision", a->precision, "bf16 (fast path, default), int8 (fast path, int8 weights and activations) or f32 (reference)")->capture_default_str();
  c->add_option("--scratch", a->scratch, "folder for the model, corpus and output (kept)");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace corelm::cli
