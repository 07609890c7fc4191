// corelm run classify|extract|score: corpus-scale batch inference over JSONL files (see
// docs/SCALE-OUT.md); corelm run batch: an OpenAI batch input file run offline through the
// persistent queue (docs/SERVING.md). Argument parsing and printing only; the jobs live in
// src/pipeline and src/serve/offline_batch.
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_escapes.h"
#include "command_registry.h"
#include "kv_cache_flags.h"
#include "corelm/error.h"
#include "corelm/pipeline.h"
#include "corelm/thread_pool.h"
#include "corelm/utf8.h"
#include "serve/offline_batch.h"

namespace corelm::cli {
namespace {

struct RunArgs {
  pipeline::RunOptions opt;
  std::string shard = "0/1", truncate = "head", task_file, regex;
  std::string cache_type_k = "f32", cache_type_v = "f32";
  bool json = false;
};

void parse_shard(const std::string& s, int& i, int& n) {
  const size_t slash = s.find('/');
  try {
    CORELM_CHECK(slash != std::string::npos, ValueError, "");
    size_t used = 0;
    i = std::stoi(s.substr(0, slash), &used);
    CORELM_CHECK(used == slash, ValueError, "");
    n = std::stoi(s.substr(slash + 1), &used);
    CORELM_CHECK(used == s.size() - slash - 1, ValueError, "");
  } catch (const std::exception&) {
    throw ValueError("--shard '" + s + "': expected i/N, e.g. 3/16");
  }
  CORELM_CHECK(n >= 1 && i >= 0 && i < n, ValueError, "--shard ", s, ": need 0 <= i < N");
}

void run(RunArgs& a, CLI::App& c, pipeline::TaskKind kind) {
  pipeline::TaskSpec& t = a.opt.task;
  if (!a.task_file.empty()) {
    // The task file sets the defaults; flags given on the command line win.
    std::ifstream in(a.task_file);
    CORELM_CHECK(in.good(), IOError, "--task ", a.task_file, ": cannot open");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError("--task " + a.task_file + ": invalid JSON: " + escape_invalid_utf8(e.what()));
    }
    pipeline::TaskSpec file;
    try {
      file = pipeline::TaskSpec::from_json(j);
    } catch (const ValueError& e) {
      throw ValueError("--task " + a.task_file + ": " + e.what());
    }
    CORELM_CHECK(!j.contains("task") || file.kind == kind, ValueError, "--task ", a.task_file, " describes a ",
                 pipeline::task_kind_name(file.kind), " task, not ", pipeline::task_kind_name(kind));
    auto given = [&](const char* name) {
      const CLI::Option* opt = c.get_option_no_throw(name);
      return opt != nullptr && opt->count() > 0;
    };
    if (!given("--template")) t.template_text = file.template_text;
    if (!given("--text-field")) t.text_field = file.text_field;
    if (!given("--id-field")) t.id_field = file.id_field;
    if (!given("--labels")) t.labels = file.labels;
    if (!given("--label-prefix")) t.label_prefix = file.label_prefix;
    if (!given("--label-eos")) t.label_eos = file.label_eos;
    if (!given("--stop")) t.stop = file.stop;
    if (!given("--max-tokens")) t.max_tokens = file.max_tokens;
    if (!given("--choices")) t.choices = file.choices;
    if (!given("--regex")) t.regex = file.regex;
    if (!given("--max-context")) t.max_context = file.max_context;
    if (!given("--truncate")) a.truncate = j.value("truncate", a.truncate);
    if (!given("--add-special")) t.add_special = file.add_special;
  }
  // Given (even empty, which the task check refuses) or unset: "" is not "no constraint".
  if (c.get_option_no_throw("--regex") && c.get_option_no_throw("--regex")->count() > 0) t.regex = a.regex;
  t.kind = kind;
  t.template_text = unescape(t.template_text);
  for (auto& s : t.stop) s = unescape(s);
  t.truncate = pipeline::parse_truncate(a.truncate);
  parse_shard(a.shard, a.opt.shard_index, a.opt.shard_count);
  a.opt.kv_cache_types = parse_kv_cache_flags(a.cache_type_k, a.cache_type_v);
  const pipeline::RunSummary s = pipeline::run(a.opt);
  if (a.json) {
    std::cout << s.manifest.dump() << "\n";
  } else if (s.manifest.contains("records")) {
    std::cerr << "run: " << s.records << " records, " << s.errors << " errors, " << s.input_tokens << " input tokens, "
              << s.tokens_per_s << " tokens/s (" << s.chunks_done << "/" << s.chunks_total << " chunks done, "
              << s.chunks_run << " in this run) -> " << a.opt.out << "\n";
  }
}

void add_task(CLI::App& group, pipeline::TaskKind kind, const std::string& help) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = group.add_subcommand(pipeline::task_kind_name(kind), help);
  pipeline::RunOptions& o = a->opt;
  pipeline::TaskSpec& t = o.task;
  c->add_option("--model", o.model, "model directory (config.json, model.safetensors, tokenizer.json)")->required();
  c->add_option("--input", o.inputs, "JSONL files (.gz/.zst read transparently) or glob patterns")->required();
  c->add_option("--out", o.out, "output directory: part-*.jsonl, errors-*.jsonl, manifest.json")->required();
  c->add_option("--task", a->task_file, "task file (JSON with the same keys as the flags: template, labels, ...)");
  c->add_option("--text-field", t.text_field, "field holding the text: a name or a JSON pointer like /a/b")
      ->capture_default_str();
  c->add_option("--id-field", t.id_field, "field holding the record id (default: FILE:LINE)");
  c->add_option("--template", t.template_text, "prompt template; {text} marks the document (\\n allowed)");
  if (kind == pipeline::TaskKind::Classify) {
    c->add_option("--labels", t.labels, "labels, comma-separated")->delimiter(',');
    c->add_option("--label-prefix", t.label_prefix, "each label is scored as the continuation PREFIX + label")
        ->capture_default_str();
    c->add_flag("--label-eos", t.label_eos, "also score the end-of-text token after each label");
  }
  if (kind == pipeline::TaskKind::Extract) {
    c->add_option("--stop", t.stop, "stop string (repeatable; cut from the output)");
    c->add_option("--max-tokens", t.max_tokens, "tokens to generate at most")->capture_default_str();
    c->add_option("--choices", t.choices, "constrain the output to one of these (comma-separated)")->delimiter(',');
    c->add_option("--regex", a->regex, "constrain the output to a full match of this regex (subset: see docs/SCALE-OUT.md)");
  }
  c->add_option("--max-context", t.max_context, "context limit in tokens (default: the model's)");
  c->add_option("--truncate", a->truncate, "over-long documents: head (keep the start), tail (keep the end), "
                                           "error (error record)")->capture_default_str();
  c->add_flag("--add-special", t.add_special, "add the tokenizer's BOS/EOS to prompts (SFT pairs have none)");
  c->add_option("--shard", a->shard, "process shard i of N (chunks balanced by bytes)")->capture_default_str();
  c->add_flag("--mpi", o.mpi, "use MPI (implied when launched by mpirun): rank r takes shard r/N");
  c->add_option("--precision", o.precision,
                "bf16 (fast path, default), int8 (int8 weights+activations), q4 (4-bit weights, int8 head) or f32 (reference)")
      ->capture_default_str();
  add_kv_cache_flags(c, a->cache_type_k, a->cache_type_v);
  c->add_option("--threads", o.threads, "threads")->capture_default_str();
  c->add_option("--batch", o.batch, "documents per forward")->capture_default_str();
  c->add_option("--chunk-records", o.chunk_records, "lines per committed output part")->capture_default_str();
  c->add_option("--max-line-bytes", o.max_line_bytes, "longer input lines become error records")->capture_default_str();
  c->add_flag("--overwrite", o.overwrite, "reuse an --out made by another model/task");
  c->add_flag("--progress", o.progress, "live progress line on stderr even when it is not a terminal");
  c->add_flag("--json", a->json, "print the manifest as one JSON line on stdout");
  c->callback([a, c, kind] { run(*a, *c, kind); });
}

struct BatchArgs {
  serve::OfflineBatchOptions o;
  std::string precision = "bf16", sync = "full", shard = "0/1";
  std::string cache_type_k = "f32", cache_type_v = "f32";
  int threads = 1;
  bool json = false;
};

void run_batch(BatchArgs& a) {
  CORELM_CHECK(a.threads >= 1 && a.threads <= kMaxThreads, ValueError, "--threads must be in [1, ", kMaxThreads,
               "] (got ", a.threads, ")");
  CORELM_CHECK(a.sync == "full" || a.sync == "normal", ValueError, "--queue-sync must be full or normal (got '", a.sync,
               "')");
  a.o.precision = model::parse_precision(a.precision);
  a.o.kv_cache_types = parse_kv_cache_flags(a.cache_type_k, a.cache_type_v);
  a.o.sync = a.sync == "full" ? queue::Sync::full : queue::Sync::normal;
  parse_shard(a.shard, a.o.shard_index, a.o.shard_count);
  set_num_threads(a.threads);
  const serve::OfflineBatchSummary s = serve::run_offline_batch(a.o);
  if (a.json) {
    std::cout << s.to_json().dump() << "\n";
  } else {
    std::cerr << "run batch: " << s.total << " requests, " << s.completed << " completed, " << s.failed << " failed ("
              << s.run_now << " run now" << (s.resumed ? ", resumed" : "") << ") -> " << s.output_path << ", "
              << s.errors_path << "\n";
  }
}

void add_batch(CLI::App& group) {
  auto a = std::make_shared<BatchArgs>();
  CLI::App* c = group.add_subcommand("batch", "Run an OpenAI batch input file ({custom_id, method, url, body} lines) "
                                              "offline, exactly once (resumable)");
  serve::OfflineBatchOptions& o = a->o;
  c->add_option("--model", o.model, "model directory or file (config.json, model.safetensors, tokenizer.json)")
      ->required();
  c->add_option("--input", o.input, "batch input file (JSONL, one request per line)")->required();
  c->add_option("--out", o.out, "output folder: output.jsonl, errors.jsonl, queue.sqlite (the journal), batch.json")
      ->required();
  c->add_option("--slots", o.slots, "sequences decoded together; up to 2x this many requests in flight")
      ->capture_default_str();
  c->add_option("--shard", a->shard, "run block i of N of the input (one --out per shard; outputs concatenate in order)")
      ->capture_default_str();
  c->add_option("--threads", a->threads, "threads")->capture_default_str();
  c->add_option("--precision", a->precision, "bf16 (fast path, default), int8, q4 or f32 (reference)")
      ->capture_default_str();
  add_kv_cache_flags(c, a->cache_type_k, a->cache_type_v);
  c->add_option("--max-tokens-limit", o.max_tokens_limit, "a body asking for more max_tokens fails (400)")
      ->capture_default_str();
  c->add_option("--max-attempts", o.max_attempts,
                "runs of one request (a crash while it runs counts) before its error result")
      ->capture_default_str();
  c->add_option("--queue-sync", a->sync, "full: fsync every commit; normal: survive kill -9, not a power cut")
      ->capture_default_str();
  c->add_flag("--overwrite", o.overwrite, "discard an --out made from another input file or model");
  c->add_flag("--progress", o.progress, "live progress line on stderr even when it is not a terminal");
  c->add_flag("--no-queue", o.no_queue, "benchmark baseline: no journal, results in memory (not resumable)");
  c->add_flag("--json", a->json, "print a JSON summary on stdout");
  c->callback([a] { run_batch(*a); });
}

RegisterCommand reg([](CLI::App& root) {
  CLI::App& group = subcommand_group(root, "run", "Classify, extract from or score JSONL corpora (exactly once)");
  add_task(group, pipeline::TaskKind::Classify, "Label each record by the log-likelihood of each label");
  add_task(group, pipeline::TaskKind::Extract, "Greedy (optionally constrained) generation per record");
  add_task(group, pipeline::TaskKind::Score, "Mean log-likelihood and perplexity per record");
  add_batch(group);
});

}  // namespace
}  // namespace corelm::cli
