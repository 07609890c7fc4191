// `corelm run batch`: an OpenAI batch input file ({custom_id, method, url, body} per line) run
// offline, in this process, through the same execution core and the same persistent queue as
// `corelm serve`. The whole file is validated first (one invalid line or a duplicate custom_id
// fails the run before anything is queued, as the Batches API does); every row is enqueued in one
// transaction into OUT/queue.sqlite, which is the journal: a rerun after a crash (kill -9
// included) reclaims the dead process's leases at once and runs only the unfinished rows. Each
// row samples with a seed derived from its content, so a resumed run writes the same
// OUT/output.jsonl and OUT/errors.jsonl (atomically, in input order) as an uninterrupted one.
// See docs/SERVING.md, "Offline batches (`corelm run batch`)".
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "corelm/model.h"
#include "corelm/queue.h"

namespace corelm::serve {

struct OfflineBatchOptions {
  std::string model;   // model path (any format load_model reads); its id is model_id_for_path(model)
  std::string input;   // the batch input file (JSONL)
  std::string out;     // output folder: queue.sqlite, batch.json, output.jsonl, errors.jsonl
  int64_t slots = 8;   // scheduler slots; up to slots + max(slots, 64) rows are leased at a time
  // --shard i/N: this process runs the i-th of N contiguous blocks of the (whole, validated)
  // input, so N machines (a SLURM array) split one file and their output.jsonl concatenate in
  // shard order to the input order.
  int shard_index = 0, shard_count = 1;
  model::Precision precision = model::Precision::BF16;
  model::KVCacheTypes kv_cache_types;  // --cache-type-k / --cache-type-v
  int64_t max_tokens_limit = 4096;
  int64_t max_attempts = 3;     // leases of one row (a crash while it ran counts) before its error result
  double lease_seconds = 300;   // renewed while the row runs; only matters for a hung process
  queue::Sync sync = queue::Sync::full;
  bool overwrite = false;       // reuse an --out made from another input file or model
  bool progress = false;        // progress line on stderr even when it is not a terminal
  // Benchmark baseline: the same rows through the same execution core with results held in
  // memory, no queue.sqlite (not resumable). Measures what the journal costs.
  bool no_queue = false;
  void validate() const;        // ValueError naming the option
};

struct OfflineBatchSummary {
  int64_t total = 0;        // rows in the input (in this shard)
  int64_t completed = 0;    // status 200 (output.jsonl)
  int64_t failed = 0;       // the rest (errors.jsonl)
  int64_t run_now = 0;      // rows executed by this process (the rest were done by an earlier run)
  bool resumed = false;     // the queue already held this input's rows
  int64_t prompt_tokens = 0, completion_tokens = 0;  // of the rows run now
  double seconds = 0;       // wall time of this process's run phase
  std::string output_path, errors_path;
  nlohmann::json to_json() const;
};

// Validates, enqueues (first run) or resumes, runs every unfinished row and writes the output
// files. ValueError naming the file and line(s) for an invalid input; ValueError naming --out
// and --overwrite for an --out made from another input or model; IOError / FormatError for
// unreadable files and a corrupt queue.
OfflineBatchSummary run_offline_batch(const OfflineBatchOptions& options);

}  // namespace corelm::serve
