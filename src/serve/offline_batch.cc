#include "offline_batch.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "batch_api.h"
#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/hash.h"
#include "corelm/model_loader.h"
#include "corelm/serve.h"
#include "corelm/utf8.h"
#include "executor.h"
#include "queue_worker.h"

namespace corelm::serve {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Every row of one `corelm run batch` folder carries this batch id: the folder holds one input.
constexpr const char* kBatchId = "run-batch";
constexpr const char* kManifestFormat = "corelm-run-batch/1";
constexpr int kMaxReportedErrors = 20;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }


std::string hex64(uint64_t v) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(v));
  return out;
}

// The seed a row samples with when its body has none: the queue worker's (a hash of endpoint,
// model and body), so a row redone after a crash draws the same tokens, and `corelm run batch`
// and `corelm serve`'s Batches API give the same answer to the same line.
uint64_t row_seed(const queue::LeasedRequest& r) { return QueueWorker::seed_for(r.endpoint, r.model, r.body); }

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, what, " ", path, ": cannot open");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CORELM_CHECK(!in.bad(), IOError, what, " ", path, ": read error");
  return s;
}

struct Validated {
  std::vector<queue::NewRequest> rows;
  std::string input_hash;
  int64_t input_bytes = 0;
  std::string shard = "0/1";
};

// The whole file or nothing: every error is collected (the first kMaxReportedErrors are named in
// the message) so a user fixes them in one pass.
Validated validate_input(const std::string& path, const std::string& model_id, const RequestLimits& limits) {
  const std::string text = read_file(path, "--input");
  Validated v;
  v.input_bytes = static_cast<int64_t>(text.size());
  v.input_hash = hex64(fnv1a(text));
  std::vector<std::string> errors;
  int64_t n_errors = 0;
  auto report = [&](int64_t line, const std::string& code, const std::string& msg) {
    if (n_errors++ < kMaxReportedErrors)
      errors.push_back(path + ":" + std::to_string(line) + ": " + code + ": " + escape_invalid_utf8(msg));
  };
  std::unordered_set<std::string> seen;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank lines carry nothing
    auto r = parse_batch_line(line, line_no, "", {model_id}, limits);
    if (auto* e = std::get_if<BatchLineError>(&r)) {
      // parse_batch_line's messages start with "line N: " (the Batches API's shape); here the
      // file:line prefix says it.
      const std::string where = "line " + std::to_string(line_no) + ": ";
      report(line_no, e->code, e->message.rfind(where, 0) == 0 ? e->message.substr(where.size()) : e->message);
      continue;
    }
    auto& row = std::get<queue::NewRequest>(r);
    const std::string cid = row.custom_id.value_or("");
    if (!seen.insert(cid).second) {
      report(line_no, "duplicate_custom_id", "custom_id '" + cid + "' appears on an earlier line");
      continue;
    }
    row.batch_id = kBatchId;
    v.rows.push_back(std::move(row));
  }
  if (n_errors > 0) {
    std::string msg = "--input " + path + ": " + std::to_string(n_errors) + " invalid line" +
                      (n_errors > 1 ? "s" : "") + " (nothing was run):";
    for (const auto& e : errors) msg += "\n  " + e;
    if (n_errors > kMaxReportedErrors) msg += "\n  ... and " + std::to_string(n_errors - kMaxReportedErrors) + " more";
    throw ValueError(msg);
  }
  CORELM_CHECK(!v.rows.empty(), ValueError, "--input ", path, ": no requests (the file has no non-blank line)");
  return v;
}

// The i-th of n contiguous blocks (sizes differ by at most one row).
void keep_shard(Validated& v, int i, int n) {
  if (n == 1) return;
  const size_t total = v.rows.size(), lo = total * static_cast<size_t>(i) / static_cast<size_t>(n),
               hi = total * static_cast<size_t>(i + 1) / static_cast<size_t>(n);
  std::vector<queue::NewRequest> mine(std::make_move_iterator(v.rows.begin() + static_cast<std::ptrdiff_t>(lo)),
                                      std::make_move_iterator(v.rows.begin() + static_cast<std::ptrdiff_t>(hi)));
  v.rows = std::move(mine);
  v.shard = std::to_string(i) + "/" + std::to_string(n);
}

class ProgressLine {
 public:
  ProgressLine(bool on, int64_t total, int64_t done_before) : on_(on), total_(total), before_(done_before) {}
  void update(int64_t done_now, int64_t tokens, int64_t failed, bool final = false) {
    if (!on_ || (!final && since(last_) < 0.5)) return;
    last_ = Clock::now();
    const double s = std::max(1e-9, since(start_));
    const int64_t done = before_ + done_now, left = total_ - done;
    const double eta = done_now > 0 ? s * double(left) / double(done_now) : 0.0;
    std::fprintf(stderr, "\r[run batch] %lld/%lld requests  %.1f req/s  %.0f tok/s  failed %lld  %.0f%%  ETA %.0fs   %s",
                 static_cast<long long>(done), static_cast<long long>(total_), done_now / s, tokens / s,
                 static_cast<long long>(failed), 100.0 * double(done) / double(std::max<int64_t>(1, total_)), eta,
                 final ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  bool on_;
  int64_t total_, before_;
  Clock::time_point start_ = Clock::now(), last_{};
};

void remove_journal(const fs::path& out) {
  for (const char* name : {"queue.sqlite", "queue.sqlite-wal", "queue.sqlite-shm", "output.jsonl", "errors.jsonl",
                           "batch.json"})
    fs::remove(out / name);
}

// What batch.json records about the input and model a folder was made from.
nlohmann::json make_manifest(const OfflineBatchOptions& o, const Validated& v, const std::string& model_id) {
  return {{"format", kManifestFormat},
          {"input", fs::absolute(o.input).lexically_normal().string()},
          {"input_bytes", v.input_bytes},
          {"input_hash", v.input_hash},
          {"model", fs::absolute(o.model).lexically_normal().string()},
          {"model_id", model_id},
          {"rows", static_cast<int64_t>(v.rows.size())},
          {"shard", v.shard},
          {"created", std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count()}};
}

// Returns the manifest to use (the stored one when it matches, a fresh one after --overwrite or
// in a new folder) and whether the folder already holds this input's journal.
std::pair<nlohmann::json, bool> check_folder(const OfflineBatchOptions& o, const Validated& v,
                                             const std::string& model_id) {
  const fs::path out(o.out), manifest_path = out / "batch.json", qpath = queue::queue_path(o.out);
  const nlohmann::json fresh = make_manifest(o, v, model_id);
  if (!fs::exists(manifest_path)) {
    if (fs::exists(qpath)) {
      CORELM_CHECK(o.overwrite, ValueError, "--out ", o.out, ": ", qpath,
                   " exists but batch.json does not (not a `corelm run batch` folder); use --overwrite to start over");
      remove_journal(out);
    }
    return {fresh, false};
  }
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_file(manifest_path.string(), "--out"));
  } catch (const nlohmann::json::exception& e) {
    if (!o.overwrite)
      throw FormatError(manifest_path.string() + ": invalid JSON (" + escape_invalid_utf8(e.what()) +
                        "); use --overwrite to start over");
  }
  bool same = false;
  std::string was = "?";
  try {  // a field of the wrong type is a different folder, not a crash
    same = m.is_object() && m.value("format", "") == kManifestFormat && m.value("input_hash", "") == v.input_hash &&
           m.value("input_bytes", int64_t(-1)) == v.input_bytes &&
           m.value("rows", int64_t(-1)) == static_cast<int64_t>(v.rows.size()) &&
           m.value("shard", std::string("0/1")) == v.shard && m.value("model", "") == fresh["model"].get<std::string>() &&
           m.value("created", int64_t(0)) > 0;
    if (m.is_object()) was = m.value("input", std::string("?")) + " with model " + m.value("model", std::string("?"));
  } catch (const nlohmann::json::exception&) {
    same = false;
  }
  if (same) return {m, fs::exists(qpath)};
  if (!o.overwrite) {
    throw ValueError("--out " + o.out + " holds a batch of another input or model (" + escape_invalid_utf8(was) +
                     "); use --overwrite to discard it and start over");
  }
  remove_journal(out);
  return {fresh, false};
}

Endpoint endpoint_of(const std::string& url) {
  return url == "/v1/chat/completions" ? Endpoint::ChatCompletions : Endpoint::Completions;
}

// Where the runner takes rows from and acks them to: the persistent queue (the product), or
// memory (--no-queue, the benchmark's baseline: the same execution path without SQLite).
struct Journal {
  virtual ~Journal() = default;
  virtual std::vector<queue::LeasedRequest> lease(int64_t n) = 0;
  virtual void complete(const std::vector<std::pair<queue::RequestId, queue::Result>>& acks) = 0;
  // complete(acks), then lease(n) (n == 0: none); the queue does both in one transaction.
  virtual std::vector<queue::LeasedRequest> complete_and_lease(
      const std::vector<std::pair<queue::RequestId, queue::Result>>& acks, int64_t n) {
    complete(acks);
    return n > 0 ? lease(n) : std::vector<queue::LeasedRequest>{};
  }
  // A failed attempt: true when the row went back to be run again, false when it ended failed.
  virtual bool retry(queue::RequestId id, const std::string& error) = 0;
  virtual bool finished() = 0;  // nothing queued or running
  virtual void renew() {}
};

class QueueJournal final : public Journal {
 public:
  QueueJournal(queue::Queue& q, std::string worker_id) : q_(q), worker_(std::move(worker_id)) {}
  std::vector<queue::LeasedRequest> lease(int64_t n) override { return q_.lease(worker_, n); }
  void complete(const std::vector<std::pair<queue::RequestId, queue::Result>>& acks) override {
    check_refused(q_.complete_many(worker_, acks));
  }
  // One commit (one fsync) for the ack group and the refill that follows it.
  std::vector<queue::LeasedRequest> complete_and_lease(
      const std::vector<std::pair<queue::RequestId, queue::Result>>& acks, int64_t n) override {
    queue::AckAndLease got = q_.complete_and_lease(worker_, acks, n);
    check_refused(got.refused);
    return std::move(got.leased);
  }
  bool retry(queue::RequestId id, const std::string& error) override {
    return q_.fail(id, worker_, error) == queue::RequestState::queued;
  }
  // An index range over the batch's queued and running rows, not a count of all its rows.
  bool finished() override { return q_.pending_in_batch(kBatchId) == 0; }
  void renew() override { q_.renew(worker_); }

 private:
  void check_refused(const std::vector<queue::RequestId>& lost) const {
    CORELM_CHECK(lost.empty(), Error, "queue ", q_.path(), ": ", lost.size(),
                 " results refused (their leases were taken by another process while this one held them)");
  }
  queue::Queue& q_;
  std::string worker_;
};

class MemoryJournal final : public Journal {
 public:
  MemoryJournal(const std::vector<queue::NewRequest>& rows, int64_t max_attempts)
      : rows_(rows), results_(rows.size()), attempts_(rows.size(), 0), max_attempts_(max_attempts) {
    for (size_t i = rows.size(); i-- > 0;) todo_.push_back(static_cast<queue::RequestId>(i + 1));
  }
  std::vector<queue::LeasedRequest> lease(int64_t n) override {
    std::vector<queue::LeasedRequest> out;
    while (n-- > 0 && !todo_.empty()) {
      const queue::RequestId id = todo_.back();
      todo_.pop_back();
      const queue::NewRequest& r = rows_[static_cast<size_t>(id - 1)];
      out.push_back({id, r.model, r.body, r.batch_id, r.custom_id, ++attempts_[static_cast<size_t>(id - 1)], r.endpoint});
      ++running_;
    }
    return out;
  }
  void complete(const std::vector<std::pair<queue::RequestId, queue::Result>>& acks) override {
    for (const auto& [id, r] : acks) results_[static_cast<size_t>(id - 1)] = r;
    running_ -= static_cast<int64_t>(acks.size());
  }
  bool retry(queue::RequestId id, const std::string& error) override {
    --running_;
    if (attempts_[static_cast<size_t>(id - 1)] >= max_attempts_) {
      results_[static_cast<size_t>(id - 1)] = queue::Result{500, "", error};
      return false;
    }
    todo_.push_back(id);
    return true;
  }
  bool finished() override { return todo_.empty() && running_ == 0; }
  const std::optional<queue::Result>& result(size_t i) const { return results_[i]; }

 private:
  const std::vector<queue::NewRequest>& rows_;
  std::vector<std::optional<queue::Result>> results_;
  std::vector<int64_t> attempts_;
  std::vector<queue::RequestId> todo_;  // a stack: next row at the back
  int64_t running_ = 0, max_attempts_;
};

// Rows acked per commit on short requests: each commit of the journal costs a fixed part (the
// fsync, the WAL pages every commit writes, BEGIN/COMMIT; ~300 µs of CPU on the AMX guest) besides
// its rows, so the group size decides much of the queue's cost per request (journal bench, µs of
// CPU per row: complete_and_lease of 16 rows ~27, of 64 rows ~13; 128 measured no better in whole
// runs). The runner still wakes every 100 ms at most, so slow requests are acked in smaller groups.
// A crash re-runs the rows in flight (up to slots + ack_group), never an acked one.
constexpr int64_t kAckGroup = 64;
int64_t ack_group(int64_t slots) { return std::max<int64_t>(slots, kAckGroup); }

// Runs every row of the journal through the scheduler, keeping up to slots + ack_group(slots) in
// flight; results are acked in groups (one transaction per wake-up).
struct Runner {
  Journal& journal;
  LoadedModel& model;
  const OfflineBatchOptions& o;
  std::string model_id, id_tag;
  int64_t created = 0;
  RequestLimits limits;
  OfflineBatchSummary& sum;

  Runner(Journal& j, LoadedModel& m, const OfflineBatchOptions& o_, std::string id, std::string tag, int64_t created_,
         RequestLimits l, OfflineBatchSummary& s)
      : journal(j), model(m), o(o_), model_id(std::move(id)), id_tag(std::move(tag)), created(created_), limits(l), sum(s) {}

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<queue::RequestId, ExecResult>> finished;

  void run(ProgressLine& progress) {
    const int64_t window = o.slots + ack_group(o.slots);
    int64_t in_flight = 0, failed_now = 0;
    auto last_renew = Clock::now();
    bool drained = false;
    const auto start = Clock::now();
    while (true) {
      if (!drained && in_flight <= o.slots) {
        auto leased = journal.lease(window - in_flight);
        if (leased.empty()) drained = true;
        for (auto& r : leased) {
          ++in_flight;
          submit(r);
        }
      }
      std::vector<std::pair<queue::RequestId, ExecResult>> got;
      {
        // Wake when the rows still in the scheduler are down to `slots` (time to refill), not at
        // every result: each wake-up is one ack-and-lease transaction for ~ack_group(slots) rows,
        // which is what keeps the journal's share of a request's time small.
        std::unique_lock lk(mu);
        cv.wait_for(lk, std::chrono::milliseconds(100), [&] {
          return static_cast<int64_t>(finished.size()) >= std::max<int64_t>(1, in_flight - o.slots);
        });
        got.swap(finished);
      }
      if (!got.empty()) {
        std::vector<std::pair<queue::RequestId, queue::Result>> acks;
        for (auto& [id, res] : got) {
          --in_flight;
          if (res.status >= 500 || res.status == 429) {
            // Not the row's fault (an overloaded or failing scheduler): back to the queue, counted
            // as an attempt so a row that always fails ends with an error result.
            if (journal.retry(id, res.body.dump())) drained = false;
            else ++failed_now;
            continue;
          }
          if (res.status == 200) {
            const auto& u = res.body.value("usage", nlohmann::json::object());
            sum.prompt_tokens += u.value("prompt_tokens", int64_t(0));
            sum.completion_tokens += u.value("completion_tokens", int64_t(0));
          } else {
            ++failed_now;
          }
          queue::Result r;
          r.status_code = res.status;
          r.body = res.body.dump();
          if (res.status != 200) r.error = res.body.contains("error") ? res.body["error"].value("message", "") : "error";
          acks.emplace_back(id, std::move(r));
        }
        if (!acks.empty()) {
          // The refill the loop's top would lease next goes in the ack's transaction.
          const int64_t want = !drained && in_flight <= o.slots ? window - in_flight : 0;
          auto leased = journal.complete_and_lease(acks, want);
          sum.run_now += static_cast<int64_t>(acks.size());
          if (want > 0 && leased.empty()) drained = true;
          for (auto& r : leased) {
            ++in_flight;
            submit(r);
          }
        }
      }
      if (since(last_renew) > o.lease_seconds / 3) {
        journal.renew();
        last_renew = Clock::now();
      }
      progress.update(sum.run_now, sum.completion_tokens, failed_now);
      if (drained && in_flight == 0) {
        if (journal.finished()) break;
        // Requeued rows (a failed attempt) or rows another process still holds: look again soon.
        drained = false;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    sum.seconds = since(start);
    progress.update(sum.run_now, sum.completion_tokens, failed_now, true);
  }

  void submit(const queue::LeasedRequest& r) {
    ExecOptions eo;
    eo.limits = limits;
    eo.max_tokens_limit = o.max_tokens_limit;
    eo.default_seed = row_seed(r);
    eo.priority = infer::SequenceRequest::kQueued;
    const bool chat = r.endpoint == "/v1/chat/completions";
    eo.response_id = std::string(chat ? "chatcmpl-" : "cmpl-") + id_tag + "-" + std::to_string(r.id);
    eo.created = created;
    const queue::RequestId id = r.id;
    try {
      execute(model, endpoint_of(r.endpoint), r.body, {model_id}, eo, [this, id](ExecResult res) {
        std::lock_guard lk(mu);
        finished.emplace_back(id, std::move(res));
        cv.notify_one();
      });
    } catch (const std::exception& e) {
      std::lock_guard lk(mu);
      finished.emplace_back(id, ExecResult{500, api_error(500, e.what()).to_json()});
      cv.notify_one();
    }
  }
};

// One output line: into output.jsonl when `ok`, else errors.jsonl. The shape of the Batches
// API's output and error files (batch_api.cc), so a consumer reads both the same way.
std::string output_line(queue::RequestId id, const std::string& custom_id, const queue::Result& r) {
  nlohmann::ordered_json line;
  line["id"] = "batch_req_" + std::to_string(id);
  line["custom_id"] = custom_id;
  nlohmann::ordered_json body = nlohmann::ordered_json::parse(r.body, nullptr, false);
  if (!r.body.empty() && !body.is_discarded()) {
    line["response"] = {{"status_code", r.status_code}, {"request_id", "req-" + std::to_string(id)}, {"body", body}};
    if (r.status_code == 200) {
      line["error"] = nullptr;
    } else {
      std::string code = "request_failed", message = r.error;
      if (body.is_object() && body.contains("error") && body["error"].is_object()) {
        const auto& e = body["error"];
        if (e.contains("code") && e["code"].is_string()) code = e["code"].get<std::string>();
        if (e.contains("message") && e["message"].is_string() && message.empty()) message = e["message"].get<std::string>();
      }
      if (message.empty()) message = "the request failed with status " + std::to_string(r.status_code);
      line["error"] = {{"code", code}, {"message", message}};
    }
  } else {
    // A row that failed --max-attempts times: the queue stored only the error.
    line["response"] = nullptr;
    line["error"] = {{"code", "server_error"}, {"message", r.error}};
  }
  return line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

// Hands line i's result and whether it is a success to write_outputs, for i = 0, 1, ... in turn.
using RowSink = std::function<void(size_t, const queue::Result&, bool)>;

// output.jsonl / errors.jsonl in input order. `rows_in_order(sink)` calls sink once per line, in
// order (a source that skipped or repeated a line would misalign the files: checked).
void write_outputs(const std::vector<queue::NewRequest>& rows, queue::RequestId first,
                   const std::function<void(const RowSink&)>& rows_in_order, OfflineBatchSummary& sum) {
  AtomicWriter out(sum.output_path), err(sum.errors_path);
  size_t next = 0;
  rows_in_order([&](size_t i, const queue::Result& r, bool ok) {
    CORELM_CHECK(i == next && i < rows.size(), Error, "run batch: result of line ", i + 1, " out of order (expected line ",
                 next + 1, ")");
    ++next;
    const std::string text = output_line(first + static_cast<queue::RequestId>(i), rows[i].custom_id.value_or(""), r);
    if (ok) {
      out.write(text);
      ++sum.completed;
    } else {
      err.write(text);
      ++sum.failed;
    }
  });
  CORELM_CHECK(next == rows.size(), Error, "run batch: ", rows.size() - next, " lines without a result");
  out.commit();
  err.commit();
}

// The journal's finished rows in id order, streamed in pages (one query per page of rows, not
// one lookup per row: on short requests the per-row lookups were a visible part of the queue's
// cost). Row first + i must be line i of the input and have a result; the first row that is
// missing from the finished ones is named with its state.
void queue_rows(const queue::Queue& q, const std::vector<queue::NewRequest>& rows, queue::RequestId first,
                const RowSink& sink) {
  size_t i = 0;
  auto mismatch = [&](queue::RequestId id) {
    return FormatError("queue " + q.path() + ": row " + std::to_string(id) + " is not line " + std::to_string(i + 1) +
                       " of the input (the journal does not match batch.json); use --overwrite to start over");
  };
  q.for_each_result(kBatchId, [&](const queue::BatchRow& b) {
    const queue::RequestId id = first + static_cast<queue::RequestId>(i);
    if (i >= rows.size() || b.id != id || b.custom_id != rows[i].custom_id.value_or("")) {
      // A row of this line that is not finished comes later in id order than it should: name it.
      if (i < rows.size() && b.id > id) return false;
      throw mismatch(b.id);
    }
    CORELM_CHECK(b.result.has_value(), FormatError, "queue ", q.path(), ": row ", id, " is ", queue::to_string(b.state),
                 " without a result");
    sink(i, *b.result, b.state == queue::RequestState::done && b.result->status_code == 200);
    ++i;
    return true;
  });
  if (i == rows.size()) return;
  const queue::RequestId id = first + static_cast<queue::RequestId>(i);
  const auto info = q.get(id);
  if (!info || info->custom_id != rows[i].custom_id || info->batch_id != std::optional<std::string>(kBatchId))
    throw mismatch(id);
  throw FormatError("queue " + q.path() + ": row " + std::to_string(id) + " is " + queue::to_string(info->state) +
                    " without a result");
}

std::shared_ptr<LoadedModel> load(const OfflineBatchOptions& o) {
  ServeOptions so;
  so.models = {o.model};
  so.slots = o.slots;
  so.max_queue = o.slots + ack_group(o.slots) + 8;  // the runner's window, all of it waiting at worst
  so.max_tokens_limit = o.max_tokens_limit;
  so.precision = o.precision;
  so.kv_cache_types = o.kv_cache_types;
  return load_model_for_serving(o.model, so);
}

void run_rows(Journal& journal, const OfflineBatchOptions& o, std::shared_ptr<LoadedModel> loaded,
              const std::string& model_id, const std::string& tag, int64_t created, const RequestLimits& limits,
              int64_t done_before, OfflineBatchSummary& sum) {
  if (!loaded) loaded = load(o);
  Runner runner(journal, *loaded, o, model_id, tag, created, limits, sum);
  ProgressLine progress(o.progress || ::isatty(STDERR_FILENO), sum.total, done_before);
  try {
    runner.run(progress);
  } catch (...) {
    // Stop the scheduler while the runner its callbacks write to still exists.
    loaded->scheduler.reset();
    throw;
  }
}

// --no-queue: the same rows through the same execution core, results held in memory and written
// at the end; nothing is journaled (a crash loses the run). The benchmark's baseline.
OfflineBatchSummary run_without_queue(const OfflineBatchOptions& o, Validated& v, const std::string& model_id,
                                      const RequestLimits& limits) {
  std::error_code ec;
  fs::create_directories(o.out, ec);
  CORELM_CHECK(!ec && fs::is_directory(o.out), IOError, "--out ", o.out, ": cannot create the folder (", ec.message(), ")");
  auto lock = FileLock::acquire_or_throw((fs::path(o.out) / ".lock").string(), "corelm run batch --out");
  CORELM_CHECK(!fs::exists(queue::queue_path(o.out)) || o.overwrite, ValueError, "--out ", o.out,
               " holds a journal (queue.sqlite); --no-queue would not use it: use another --out or --overwrite");
  if (o.overwrite) remove_journal(o.out);
  OfflineBatchSummary sum;
  sum.total = static_cast<int64_t>(v.rows.size());
  sum.output_path = (fs::path(o.out) / "output.jsonl").string();
  sum.errors_path = (fs::path(o.out) / "errors.jsonl").string();
  MemoryJournal journal(v.rows, o.max_attempts);
  run_rows(journal, o, nullptr, model_id, v.input_hash.substr(0, 12), 0, limits, 0, sum);
  write_outputs(v.rows, 1, [&](const RowSink& sink) {
    for (size_t i = 0; i < v.rows.size(); ++i) {
      const auto& r = journal.result(i);
      sink(i, r.value_or(queue::Result{500, "", "not run"}), r && r->status_code == 200);
    }
  }, sum);
  return sum;
}

}  // namespace

void OfflineBatchOptions::validate() const {
  CORELM_CHECK(!model.empty(), ValueError, "--model is required");
  CORELM_CHECK(!input.empty(), ValueError, "--input is required");
  CORELM_CHECK(!out.empty(), ValueError, "--out is required");
  CORELM_CHECK(shard_count >= 1 && shard_index >= 0 && shard_index < shard_count, ValueError, "--shard ", shard_index,
               "/", shard_count, ": need 0 <= i < N");
  CORELM_CHECK(slots >= 1 && slots <= 256, ValueError, "--slots must be in [1, 256] (got ", slots, ")");
  CORELM_CHECK(max_tokens_limit >= 1, ValueError, "--max-tokens-limit must be >= 1 (got ", max_tokens_limit, ")");
  CORELM_CHECK(max_attempts >= 1, ValueError, "--max-attempts must be >= 1 (got ", max_attempts, ")");
  CORELM_CHECK(lease_seconds > 0, ValueError, "--lease-seconds must be > 0 (got ", lease_seconds, ")");
}

nlohmann::json OfflineBatchSummary::to_json() const {
  return {{"total", total},
          {"completed", completed},
          {"failed", failed},
          {"run_now", run_now},
          {"resumed", resumed},
          {"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"seconds", seconds},
          {"requests_per_s", seconds > 0 ? run_now / seconds : 0.0},
          {"tokens_per_s", seconds > 0 ? completion_tokens / seconds : 0.0},
          {"output", output_path},
          {"errors", errors_path}};
}

OfflineBatchSummary run_offline_batch(const OfflineBatchOptions& o) {
  o.validate();
  const std::string model_id = model_id_for_path(o.model);
  RequestLimits limits;
  limits.max_n = static_cast<int>(std::min<int64_t>(16, o.slots));
  limits.max_tokens_limit = o.max_tokens_limit;
  CORELM_CHECK(fs::exists(o.model), IOError, "--model ", o.model, ": no such file or folder");
  // Validation before touching --out: an invalid file leaves no trace.
  Validated v = validate_input(o.input, model_id, limits);
  keep_shard(v, o.shard_index, o.shard_count);
  CORELM_CHECK(!v.rows.empty(), ValueError, "--shard ", v.shard, ": no rows in this shard (the input has fewer rows than shards)");
  if (o.no_queue) return run_without_queue(o, v, model_id, limits);

  std::error_code ec;
  fs::create_directories(o.out, ec);
  CORELM_CHECK(!ec && fs::is_directory(o.out), IOError, "--out ", o.out, ": cannot create the folder (", ec.message(), ")");
  // One process per folder: a second run on the same --out would race the first for its rows
  // and its output files.
  auto lock = FileLock::acquire_or_throw((fs::path(o.out) / ".lock").string(), "corelm run batch --out");
  auto [manifest, resume] = check_folder(o, v, model_id);
  const fs::path manifest_path = fs::path(o.out) / "batch.json";
  // A new folder: the model is loaded before anything is written, so a --model that does not load
  // leaves no journal behind (its rerun with the right path is not "another model").
  std::shared_ptr<LoadedModel> loaded;
  if (!resume) {
    loaded = load(o);
    write_file_atomic(manifest_path.string(), manifest.dump(2) + "\n");
  }

  queue::QueueOptions qo;
  qo.max_requests = std::max<int64_t>(qo.max_requests, static_cast<int64_t>(v.rows.size()));
  qo.lease_seconds = o.lease_seconds;
  qo.max_attempts = o.max_attempts;
  qo.sync = o.sync;
  qo.dedup = false;  // every line is its own row and result, even when two lines are identical
  queue::Queue q = queue::Queue::open(queue::queue_path(o.out), qo);

  OfflineBatchSummary sum;
  sum.total = static_cast<int64_t>(v.rows.size());
  sum.output_path = (fs::path(o.out) / "output.jsonl").string();
  sum.errors_path = (fs::path(o.out) / "errors.jsonl").string();
  // The rows are enqueued in one transaction into a queue that holds nothing else, so they are
  // ids first .. first + N - 1 in input order (write_outputs checks every one).
  queue::RequestId first = 1;
  const queue::Counts before = q.counts(kBatchId);
  if (before.total() == 0) {
    CORELM_CHECK(q.counts().total() == 0, FormatError, "queue ", q.path(),
                 " holds requests of another batch; use --overwrite to start over");
    first = q.enqueue_many(v.rows).front();
  } else {
    CORELM_CHECK(before.total() == sum.total, FormatError, "queue ", q.path(), " holds ", before.total(),
                 " rows but the input has ", sum.total, "; use --overwrite to start over");
    sum.resumed = true;
  }

  const queue::Counts now = q.counts(kBatchId);
  const int64_t done_before = now.done + now.failed + now.cancelled;
  if (done_before < sum.total) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    QueueJournal journal(q, std::string(host) + ":" + std::to_string(::getpid()) + ":run-batch");
    run_rows(journal, o, std::move(loaded), model_id, manifest.value("input_hash", std::string("0")).substr(0, 12),
             manifest.value("created", int64_t(0)), limits, done_before, sum);
  }
  write_outputs(v.rows, first, [&](const RowSink& sink) { queue_rows(q, v.rows, first, sink); }, sum);
  return sum;
}

}  // namespace corelm::serve
