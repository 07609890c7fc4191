// Corpus-scale batch inference (`corelm run`): classify, extract from or score every record of
// JSONL files (plain, .gz, .zst) with one model, exactly once, on one core or many processes.
// The input is cut into chunks of records; each chunk's output is committed as one part file
// (atomic rename) plus a journal line, so a killed run restarted with the same command skips
// finished chunks and ends with the same bytes as an uninterrupted run. See docs/SCALE-OUT.md.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/kv_cache_type.h"

namespace corelm::pipeline {

enum class TaskKind { Classify, Extract, Score };
TaskKind parse_task_kind(const std::string& name);  // "classify" | "extract" | "score"; ValueError
std::string task_kind_name(TaskKind kind);

// What to do with a document longer than the context: keep its first tokens ("head"), keep its
// last tokens ("tail"), or write an error record for it ("error"); the run continues either way.
enum class Truncate { Head, Tail, Error };
Truncate parse_truncate(const std::string& name);

// Everything that decides the output bytes (hashed into the task hash), plus execution knobs
// (batch, threads, shard, progress) that never change the output.
struct TaskSpec {
  TaskKind kind = TaskKind::Classify;
  std::string template_text;           // empty: the task's default ("{text}\nLabel:" for classify)
  std::string text_field = "text";     // a field name or a JSON pointer ("/a/b")
  std::string id_field;                // empty: ids are "FILE:LINE"
  // classify
  std::vector<std::string> labels;
  std::string label_prefix = " ";      // each label is scored as the continuation prefix + label
  bool label_eos = false;              // also score the tokenizer's EOS after the label
  // extract
  std::vector<std::string> stop;
  int64_t max_tokens = 32;
  std::vector<std::string> choices;    // constrained: the output is one of these
  std::optional<std::string> regex;    // constrained: the output matches this (see regex_nfa.h);
                                       // set but empty is refused by validate()
  // all
  int64_t max_context = 0;             // 0: the model's max_position_embeddings
  Truncate truncate = Truncate::Head;
  bool add_special = false;            // BOS etc. on the prompt (SFT pairs are encoded without)

  std::string effective_template() const;
  void validate() const;  // ValueError naming the option (also for strings that are not UTF-8)
  nlohmann::ordered_json to_json() const;
  // A task file; an unknown key or a value of the wrong type -> ValueError naming the key.
  static TaskSpec from_json(const nlohmann::json& j);
};

struct RunOptions {
  std::string model;                   // model directory
  std::vector<std::string> inputs;     // files or glob patterns (each glob's matches sorted)
  std::string out;                     // output directory
  TaskSpec task;
  std::string precision = "bf16";      // "bf16": the packed fast path; "f32": the reference ops
  model::KVCacheTypes kv_cache_types;  // what the KV caches store (--cache-type-k / --cache-type-v)
  int64_t batch = 16;                  // documents per forward
  int threads = 1;
  int shard_index = 0, shard_count = 1;  // --shard i/N
  bool mpi = false;                    // force MPI_Init (also implied by OMPI_COMM_WORLD_SIZE)
  int64_t chunk_records = 256;         // records per committed unit (part file)
  int64_t max_line_bytes = int64_t(8) << 20;  // longer lines become error records
  bool overwrite = false;              // discard an existing OUT made by another task/model
  bool progress = false;               // live line on stderr (also when stderr is a tty)
  int64_t max_logits_floats = int64_t(32) << 20;  // memory bound on one forward's logits
};

struct RunSummary {
  int64_t records = 0, errors = 0, input_tokens = 0;  // whole output (all chunks committed so far)
  int64_t chunks_total = 0, chunks_done = 0, chunks_run = 0;  // chunks_run: by this invocation
  double seconds = 0;        // summed per-chunk process time of the committed chunks (see SCALE-OUT.md)
  double tokens_per_s = 0;   // input_tokens / seconds
  double wall_seconds = 0;   // this invocation
  int ranks = 1;
  bool complete = false;     // every chunk of the plan is committed
  nlohmann::ordered_json manifest;  // what OUT/manifest.json holds
};

// Runs (or resumes) the job; throws corelm errors for problems with the model, options or output
// directory. Bad records never throw: they go to OUT/errors-*.jsonl.
RunSummary run(const RunOptions& options);

}  // namespace corelm::pipeline
