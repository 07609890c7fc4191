// corelm run: plan the chunks, pick this process's share, read/tokenize on a second thread while
// the model works, commit chunk by chunk, and write the manifest. See docs/SCALE-OUT.md.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "corelm/error.h"
#include "corelm/model_dir.h"
#include "corelm/model_loader.h"
#include "corelm/mpi.h"
#include "corelm/pipeline.h"
#include "corelm/thread_pool.h"
#include "corelm/utf8.h"
#include "pipeline/engine.h"
#include "pipeline/hash.h"
#include "pipeline/input.h"
#include "pipeline/output_dir.h"
#include "pipeline/plan_cache.h"
#include "pipeline/reader.h"

namespace corelm::pipeline {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
using MpiWorld = dist::World;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The one place a model is loaded (HF/GGUF inputs plug in here). BF16 packs the weights for the
// fast inference path once; F32 runs the reference ops.
// Any checkpoint model::load_model reads (corelm/HF folder, GGUF, llama2.c .bin with a
// tokenizer next to it is not supported here: pass a folder or GGUF that carries its tokenizer).
model::LoadedModel load_model(const std::string& path, const std::string& precision, model::KVCacheTypes kv) {
  const model::Precision p = model::parse_precision(precision);
  model::Checkpoint ck = model::load_model(path);
  model::LoadedModel m = std::move(ck.model);
  CORELM_CHECK(m.tokenizer != nullptr, ValueError, "corelm run: ", path, " carries no tokenizer");
  if (p != model::Precision::F32) m.decoder.prepare_inference(p);
  m.decoder.set_kv_cache_types(kv);
  return m;
}

std::string model_hash(const model::LoadedModel& m, const std::string& path) {
  Hasher h;
  h.update(m.decoder.config().to_json().dump());
  for (const auto& [name, t] : m.decoder.named_parameters()) {
    h.update(name);
    const Tensor c = t.contiguous();
    h.update(c.raw_data(), c.nbytes());
  }
  const fs::path tok = fs::path(path) / "tokenizer.json";
  if (fs::exists(tok)) {
    hash_file(h, tok.string());
  } else if (fs::is_regular_file(path)) {
    // A GGUF carries its vocabulary in the metadata at the head of the file.
    std::ifstream in(path, std::ios::binary);
    std::string head(size_t(16) << 20, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    h.update(head.data(), static_cast<size_t>(in.gcount()));
  }
  return h.hex();
}

// A bounded hand-over from the reader thread to the model thread.
class WorkQueue {
 public:
  explicit WorkQueue(size_t capacity) : cap_(capacity) {}
  bool push(ChunkWork w) {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return q_.size() < cap_ || stop_; });
    if (stop_) return false;
    q_.push_back(std::move(w));
    cv_.notify_all();
    return true;
  }
  // False when the producer is finished (or failed: rethrows its error) and nothing is left.
  bool pop(ChunkWork& w) {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return false;
    }
    w = std::move(q_.front());
    q_.pop_front();
    cv_.notify_all();
    return true;
  }
  void close(std::exception_ptr error = nullptr) {
    std::lock_guard lk(m_);
    closed_ = true;
    error_ = error;
    cv_.notify_all();
  }
  void stop() {
    std::lock_guard lk(m_);
    stop_ = true;
    cv_.notify_all();
  }

 private:
  size_t cap_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<ChunkWork> q_;
  bool closed_ = false, stop_ = false;
  std::exception_ptr error_;
};

class ProgressLine {
 public:
  ProgressLine(bool on, uint64_t total_bytes) : on_(on), total_(total_bytes) {}
  void update(int64_t records, int64_t tokens, int64_t errors, uint64_t bytes, bool final = false) {
    if (!on_ || (!final && since(last_) < 0.5)) return;
    last_ = Clock::now();
    const double s = std::max(1e-9, since(start_));
    const double eta = bytes > 0 && total_ > bytes ? s * (double(total_ - bytes) / double(bytes)) : 0.0;
    std::fprintf(stderr, "\r[run] %lld records  %.1f rec/s  %.0f tok/s  errors %lld  %.0f%%  ETA %.0fs   %s",
                 static_cast<long long>(records), records / s, tokens / s, static_cast<long long>(errors),
                 total_ ? 100.0 * double(bytes) / double(total_) : 100.0, eta, final ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  bool on_;
  uint64_t total_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::time_point{};
};

// Output lines of one chunk, in input order. JSON output must be valid UTF-8: file names and
// reasons (which may quote input bytes) are escaped; the model's own output (a cut multi-byte
// character) is replaced.
void render(const ChunkWork& work, const std::string& file, std::string& parts, std::string& errors, ChunkStats& st) {
  const auto dump = [](const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  };
  for (const Item& it : work.items) {
    if (!it.doc) {
      nlohmann::ordered_json e{{"file", escape_invalid_utf8(file)},
                               {"line", it.line},
                               {"id", it.id},
                               {"reason", escape_invalid_utf8(it.error)}};
      errors += dump(e);
      ++st.errors;
      continue;
    }
    nlohmann::ordered_json out{{"id", it.id}};
    for (const auto& [k, v] : it.doc->result.items()) out[k] = v;
    parts += dump(out);
    ++st.records;
    st.input_tokens += static_cast<int64_t>(it.doc->tokens.size());
  }
}

void run_chunk_batches(Engine& engine, ChunkWork& work) {
  // Length buckets (each document's own padded length), then batches in input order per bucket.
  std::map<int64_t, std::vector<PreparedDoc*>> buckets;
  for (Item& it : work.items)
    if (it.doc) buckets[engine.bucket(*it.doc)].push_back(&*it.doc);
  for (auto& [len, docs] : buckets)
    for (size_t i = 0; i < docs.size(); i += static_cast<size_t>(engine.batch_capacity())) {
      const size_t end = std::min(docs.size(), i + static_cast<size_t>(engine.batch_capacity()));
      engine.run_batch(std::vector<PreparedDoc*>(docs.begin() + i, docs.begin() + end));
    }
}

RunSummary run_impl(const RunOptions& o, const MpiWorld& world) {
  const auto t_start = Clock::now();
  set_num_threads(std::max(1, o.threads));
  CORELM_CHECK(!o.model.empty(), ValueError, "--model is required");
  CORELM_CHECK(!o.out.empty(), ValueError, "--out is required");
  CORELM_CHECK(o.max_line_bytes > 0, ValueError, "--max-line-bytes must be positive");
  o.task.validate();
  int shard = o.shard_index, shards = o.shard_count;
  if (world.active()) {
    CORELM_CHECK(shards == 1, ValueError, "--shard cannot be combined with MPI (each rank takes its share)");
    shard = world.rank();
    shards = world.size();
  }
  CORELM_CHECK(shards >= 1 && shard >= 0 && shard < shards, ValueError, "--shard ", shard, "/", shards,
               ": need 0 <= i < N");

  const std::vector<std::string> files = expand_inputs(o.inputs);
  CORELM_CHECK(o.chunk_records > 0, ValueError, "--chunk-records must be positive, got ", o.chunk_records);
  model::LoadedModel model = load_model(o.model, o.precision, o.kv_cache_types);
  // The task hash covers everything that decides the output bytes: the task, the inputs (names,
  // sizes, modification times), the chunk size and the line limit; never batch/threads/shards.
  Hasher th;
  nlohmann::ordered_json task_json = o.task.to_json();
  nlohmann::ordered_json hashed = task_json;
  hashed["inputs"] = input_fingerprint(files, o.chunk_records);
  hashed["max_line_bytes"] = o.max_line_bytes;
  hashed["precision"] = o.precision;
  // Lossy caches change the outputs; f32 adds nothing so existing outputs keep their hash.
  if (!o.kv_cache_types.all_f32())
    hashed["kv_cache_types"] = {model::kv_cache_type_name(o.kv_cache_types.k), model::kv_cache_type_name(o.kv_cache_types.v)};
  th.update(hashed.dump());
  std::vector<std::string> file_names;  // as written to JSON (run.json, manifest)
  for (const auto& f : files) file_names.push_back(escape_invalid_utf8(f));
  nlohmann::ordered_json identity{{"model", escape_invalid_utf8(o.model)},
                                  {"model_hash", model_hash(model, o.model)},
                                  {"task_hash", th.hex()},
                                  {"task", task_json},
                                  {"inputs", file_names},
                                  {"chunk_records", o.chunk_records},
                                  {"max_line_bytes", o.max_line_bytes}};
  if (world.active() && world.rank() != 0) world.barrier();  // rank 0 settles run.json first
  const std::string tag = std::to_string(shard) + "-of-" + std::to_string(shards);
  OutputDir out(o.out, identity, o.overwrite && world.rank() == 0, tag);
  if (world.active() && world.rank() == 0) world.barrier();

  const Plan plan = cached_plan(files, o.chunk_records, o.out);
  for (const auto& f : plan.empty_files)
    if (world.rank() == 0) std::cerr << "warning: input " << f << " is empty (no records)\n";
  CORELM_CHECK(!plan.chunks.empty(), ValueError, "--input: the input files hold no lines (",
               plan.empty_files.size(), " empty file(s))");

  Engine engine(model.decoder, *model.tokenizer, o.task, o.max_logits_floats);
  engine.set_batch(o.batch);

  const std::vector<int64_t> mine = plan.shard_chunks(shard, shards);
  const std::map<int64_t, ChunkStats> done_before = out.done();
  std::vector<int64_t> todo;
  uint64_t todo_bytes = 0;
  for (int64_t c : mine)
    if (!done_before.count(c)) {
      todo.push_back(c);
      todo_bytes += plan.chunks[c].bytes;
    }
  out.discard_temps(todo);

  const bool show = o.progress || ::isatty(STDERR_FILENO);
  ProgressLine progress(show, todo_bytes);
  WorkQueue queue(2);
  std::thread reader_thread([&] {
    try {
      ChunkReader reader(plan, o.task, engine, o.max_line_bytes);
      for (int64_t c : todo)
        if (!queue.push(reader.read(plan.chunks[c]))) return;
      queue.close();
    } catch (...) {
      queue.close(std::current_exception());
    }
  });
  int64_t records = 0, tokens = 0, errors = 0, chunks_run = 0;
  uint64_t bytes = 0;
  try {
    ChunkWork work;
    // A chunk's seconds run from the previous commit to its own: model time plus any wait for the
    // reader, so the sum over chunks is this process's wall time (honest on a shared core).
    auto t_last = Clock::now();
    while (queue.pop(work)) {
      run_chunk_batches(engine, work);
      ChunkStats st;
      st.chunk = work.chunk.index;
      std::string parts, errs;
      render(work, plan.files[work.chunk.file], parts, errs, st);
      st.seconds = since(t_last);
      t_last = Clock::now();
      out.commit(st, parts, errs);
      records += st.records;
      tokens += st.input_tokens;
      errors += st.errors;
      bytes += work.chunk.bytes;
      ++chunks_run;
      progress.update(records, tokens, errors, bytes);
    }
  } catch (...) {
    queue.stop();
    reader_thread.join();
    throw;
  }
  reader_thread.join();
  progress.update(records, tokens, errors, bytes, true);

  // Merged manifest: rank 0 (or this process) sums the journal of every process.
  const double wall = since(t_start);
  std::vector<double> mine_stats{double(chunks_run), double(records), double(tokens), wall};
  world.barrier();
  const std::vector<double> all = world.gather(mine_stats);
  RunSummary s;
  s.ranks = world.size();
  s.chunks_run = chunks_run;
  s.wall_seconds = wall;
  s.chunks_total = static_cast<int64_t>(plan.chunks.size());
  const auto done = out.done();
  for (const auto& [c, st] : done) {
    if (c >= s.chunks_total) continue;
    ++s.chunks_done;
    s.records += st.records;
    s.errors += st.errors;
    s.input_tokens += st.input_tokens;
    s.seconds += st.seconds;
  }
  s.complete = s.chunks_done == s.chunks_total;
  s.tokens_per_s = s.seconds > 0 ? s.input_tokens / s.seconds : 0.0;
  nlohmann::ordered_json m;
  m["records"] = s.records;
  m["errors"] = s.errors;
  m["input_tokens"] = s.input_tokens;
  m["seconds"] = s.seconds;
  m["tokens_per_s"] = s.tokens_per_s;
  m["records_per_s"] = s.seconds > 0 ? s.records / s.seconds : 0.0;
  m["wall_seconds"] = wall;
  m["complete"] = s.complete;
  m["chunks"] = {{"total", s.chunks_total}, {"done", s.chunks_done}, {"records_per_chunk", o.chunk_records}};
  m["parts"] = "part-*.jsonl (concatenate in name order)";
  m["model"] = escape_invalid_utf8(o.model);
  m["model_hash"] = identity["model_hash"];
  m["task_hash"] = identity["task_hash"];
  m["task"] = task_json;
  m["inputs"] = file_names;
  nlohmann::ordered_json empty = nlohmann::ordered_json::array();
  for (const auto& f : plan.empty_files) empty.push_back(escape_invalid_utf8(f));
  m["empty_inputs"] = empty;
  m["shard"] = {{"index", shard}, {"count", shards}, {"mpi", world.active()}};
  m["precision"] = o.precision;
  m["cache_type_k"] = model::kv_cache_type_name(o.kv_cache_types.k);
  m["cache_type_v"] = model::kv_cache_type_name(o.kv_cache_types.v);
  m["batch"] = o.batch;
  m["threads"] = o.threads;
  if (world.active()) {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (size_t r = 0; r + 3 < all.size(); r += 4)
      ranks.push_back({{"rank", r / 4}, {"chunks_run", all[r]}, {"records", all[r + 1]}, {"input_tokens", all[r + 2]},
                       {"wall_seconds", all[r + 3]}});
    m["ranks"] = ranks;
  }
  s.manifest = m;
  if (world.rank() == 0) out.write_json("manifest.json", m);
  return s;
}

}  // namespace

RunSummary run(const RunOptions& options) {
  MpiWorld world(options.mpi);
  try {
    RunOptions with_defaults = options;
    apply_model_task_defaults(with_defaults.task, options.model);  // a head's labels and template
    return run_impl(with_defaults, world);
  } catch (const std::exception& e) {
    if (!world.active()) throw;
    // Other ranks would wait forever at the next barrier: report and take the job down.
    std::cerr << "error (rank " << world.rank() << "): " << e.what() << "\n";
    world.abort(1);
  }
}

}  // namespace corelm::pipeline
