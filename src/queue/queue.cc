#include "corelm/queue.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "corelm/durable.h"

namespace corelm::queue {
namespace {

// PRAGMA application_id of a corelm queue ("CLMQ"): tells our file from another program's SQLite.
constexpr int32_t kApplicationId = 0x434C4D51;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// FNV-1a 64 of model \0 body (\0 endpoint when it is not the default): only an index key; a
// dedup hit is confirmed by comparing the full model, body and endpoint, so a collision cannot
// return another request's result. The default endpoint adds nothing, so the hashes of rows
// written by schema v1 (all /v1/completions) stay valid after the migration.
std::string content_hash(const std::string& model, const std::string& body, const std::string& endpoint) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
  };
  mix(model);
  h ^= 0;
  h *= 1099511628211ull;
  mix(body);
  if (endpoint != kDefaultEndpoint) {
    h ^= 0;
    h *= 1099511628211ull;
    mix(endpoint);
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

RequestState parse_state(const std::string& s, const std::string& path) {
  if (s == "queued") return RequestState::queued;
  if (s == "running") return RequestState::running;
  if (s == "done") return RequestState::done;
  if (s == "failed") return RequestState::failed;
  if (s == "cancelled") return RequestState::cancelled;
  throw FormatError("queue " + path + ": unknown request state '" + s + "'");
}

// Schema v1 (kept verbatim: a new file is created as v1 and then migrated, so the migration
// path that old files take is the one every test exercises). Partial indexes keep the hot queries (next queued, expired leases, dedup lookups)
// off the done rows that make up most of a long-lived queue. state_counts is kept by triggers so
// the max_requests check and counts() are O(1) at a million rows.
const char* kSchemaV1 = R"sql(
CREATE TABLE files(
  id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
  content BLOB, status TEXT NOT NULL DEFAULT 'processed', created_at REAL NOT NULL);
CREATE TABLE batches(
  id TEXT PRIMARY KEY, input_file_id TEXT, endpoint TEXT NOT NULL DEFAULT '',
  completion_window TEXT NOT NULL DEFAULT '', metadata TEXT, status TEXT NOT NULL DEFAULT 'validating',
  output_file_id TEXT, error_file_id TEXT, errors TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE requests(
  id INTEGER PRIMARY KEY, batch_id TEXT, custom_id TEXT, model TEXT NOT NULL, body TEXT NOT NULL,
  content_hash TEXT NOT NULL,
  state TEXT NOT NULL CHECK(state IN ('queued','running','done','failed','cancelled')),
  attempts INTEGER NOT NULL DEFAULT 0, lease_expiry REAL, worker_id TEXT, worker_pid INTEGER,
  worker_host TEXT, last_error TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE INDEX requests_queued ON requests(id) WHERE state = 'queued';
CREATE INDEX requests_running ON requests(lease_expiry) WHERE state = 'running';
CREATE INDEX requests_worker ON requests(worker_id) WHERE state = 'running';
CREATE INDEX requests_done_hash ON requests(content_hash) WHERE state = 'done';
CREATE INDEX requests_batch ON requests(batch_id, state) WHERE batch_id IS NOT NULL;
CREATE UNIQUE INDEX requests_custom_id ON requests(batch_id, custom_id)
  WHERE batch_id IS NOT NULL AND custom_id IS NOT NULL;
CREATE TABLE results(
  request_id INTEGER PRIMARY KEY REFERENCES requests(id), status_code INTEGER NOT NULL,
  body TEXT NOT NULL, error TEXT, finished_at REAL NOT NULL);
CREATE TABLE state_counts(state TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO state_counts VALUES ('queued',0),('running',0),('done',0),('failed',0),('cancelled',0);
CREATE TRIGGER requests_count_insert AFTER INSERT ON requests BEGIN
  UPDATE state_counts SET n = n + 1 WHERE state = NEW.state; END;
CREATE TRIGGER requests_count_update AFTER UPDATE OF state ON requests WHEN OLD.state <> NEW.state BEGIN
  UPDATE state_counts SET n = n - 1 WHERE state = OLD.state;
  UPDATE state_counts SET n = n + 1 WHERE state = NEW.state; END;
CREATE TRIGGER requests_count_delete AFTER DELETE ON requests BEGIN
  UPDATE state_counts SET n = n - 1 WHERE state = OLD.state; END;
)sql";

// v1 -> v2: the endpoint of each request (chat vs completions bodies), the OpenAI batch
// lifecycle timestamps, the link from an output / error file to its batch (their content is
// rendered from the results, never stored), and a batch's request counts frozen when it ends
// (so a finished batch reads in O(1) and keeps its counts after its rows are purged).
const char* kMigrateV1toV2 = R"sql(
ALTER TABLE requests ADD COLUMN endpoint TEXT NOT NULL DEFAULT '/v1/completions';
ALTER TABLE files ADD COLUMN batch_id TEXT;
ALTER TABLE files ADD COLUMN kind TEXT NOT NULL DEFAULT 'upload';
ALTER TABLE batches ADD COLUMN in_progress_at REAL;
ALTER TABLE batches ADD COLUMN expires_at REAL;
ALTER TABLE batches ADD COLUMN finalizing_at REAL;
ALTER TABLE batches ADD COLUMN completed_at REAL;
ALTER TABLE batches ADD COLUMN failed_at REAL;
ALTER TABLE batches ADD COLUMN expired_at REAL;
ALTER TABLE batches ADD COLUMN cancelling_at REAL;
ALTER TABLE batches ADD COLUMN cancelled_at REAL;
CREATE INDEX files_created ON files(created_at, id);
CREATE INDEX batches_created ON batches(created_at, id);
CREATE INDEX batches_status ON batches(status);
ALTER TABLE batches ADD COLUMN request_total INTEGER;
ALTER TABLE batches ADD COLUMN request_completed INTEGER;
ALTER TABLE batches ADD COLUMN request_failed INTEGER;
CREATE INDEX files_batch ON files(batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX requests_batch_order ON requests(batch_id, id) WHERE batch_id IS NOT NULL;
)sql";

// v2 -> v3: less SQLite work per state change (issue 16: the queue's fixed cost per request).
// A lease and an ack each rewrote the row, four index entries that follow `state` and two
// state_counts rows per row through a trigger. Now:
// - requests_worker goes: renew() and reclaim find a worker's rows through requests_running
//   (running rows are few: the leases in flight).
// - requests_batch (batch_id, state) over every row becomes requests_batch_pending over the
//   queued and running rows only: an ack drops the row's entry instead of moving it to 'done'.
//   pending_in_batch() and cancel_batch() range over it; counts(batch_id) reads the batch's rows
//   through requests_batch_order.
// - The insert and update triggers on state_counts go: the statements that change states add
//   their totals once per transaction (Impl::delta). The delete trigger stays (delete_file only).
// The state counts are left as the triggers kept them; the rows are not touched.
const char* kMigrateV2toV3 = R"sql(
DROP INDEX requests_worker;
DROP INDEX requests_batch;
CREATE INDEX requests_batch_pending ON requests(batch_id, state)
  WHERE batch_id IS NOT NULL AND state IN ('queued','running');
DROP TRIGGER requests_count_insert;
DROP TRIGGER requests_count_update;
)sql";

// v3 -> v4: fewer index pages written per ack group (issue 16). WAL frames per commit of a
// 16-row ack + refill, 5,000 rows, 640-byte results: 24.5 in v3, 13.2 in v4.
// - requests_done_hash holds only the done rows written by a queue with dedup on (the new
//   `dedup` column; the rows already in the file keep theirs, DEFAULT 1). Its key is a hash, so
//   each ack inserted into a random leaf: ~10 of v3's 24.5 pages per commit at 5,000 rows, one
//   page per row at a million; `corelm run batch` (dedup off) now writes none. A row enqueued
//   with dedup off is not a dedup source (its result may be sampled, and no reader asked for it).
// - requests_batch_pending is keyed by batch_id alone (v3: batch_id, state), so a lease deletes
//   and reinserts the row's entry in place instead of moving it to the 'running' part of the
//   batch's range: the pages written at a lease are the ones the ack writes next.
const char* kMigrateV3toV4 = R"sql(
ALTER TABLE requests ADD COLUMN dedup INTEGER NOT NULL DEFAULT 1;
DROP INDEX requests_done_hash;
CREATE INDEX requests_done_hash ON requests(content_hash) WHERE state = 'done' AND dedup = 1;
DROP INDEX requests_batch_pending;
CREATE INDEX requests_batch_pending ON requests(batch_id)
  WHERE batch_id IS NOT NULL AND state IN ('queued','running');
)sql";

}  // namespace

// The v1 DDL and the migrations, for tests that build an old file to check the migration.
const char* schema_v1_sql() { return kSchemaV1; }
const char* schema_migration_sql(int64_t version) {
  if (version == 2) return kMigrateV1toV2;
  if (version == 3) return kMigrateV2toV3;
  if (version == 4) return kMigrateV3toV4;
  return nullptr;
}

const char* to_string(RequestState s) {
  switch (s) {
    case RequestState::queued: return "queued";
    case RequestState::running: return "running";
    case RequestState::done: return "done";
    case RequestState::failed: return "failed";
    case RequestState::cancelled: return "cancelled";
  }
  return "?";
}

std::string queue_path(const std::string& state_dir) {
  return (std::filesystem::path(state_dir) / "queue.sqlite").string();
}

struct Queue::Impl {
  std::string path;
  QueueOptions opt;
  sqlite3* db = nullptr;
  std::string host = host_name();
  mutable std::mutex mu;
  // Keyed by the SQL literal's address: every cached statement is a string literal.
  mutable std::unordered_map<const char*, sqlite3_stmt*> stmts;
  // State changes of the open write transaction, added to state_counts once before its commit
  // (schema v3: one UPDATE per state per transaction instead of a trigger per row).
  Counts delta;

  // Statements whose text depends on a row count (the multi-row ack): keyed by kind and count.
  mutable std::unordered_map<int64_t, sqlite3_stmt*> sized_stmts;

  ~Impl() {
    for (auto& [sql, st] : stmts) sqlite3_finalize(st);
    for (auto& [key, st] : sized_stmts) sqlite3_finalize(st);
    if (db) sqlite3_close_v2(db);
  }

  // Waiting for another process's write lock. SQLite's own busy_timeout sleeps in steps growing
  // to 100 ms, so a process that commits in a tight loop starves the other one (seen with two
  // workers: one got every request); polling every ~1 ms, with jitter, gives the waiter a fair
  // chance at each gap between the holder's transactions.
  std::chrono::steady_clock::time_point busy_since;
  unsigned busy_seed = static_cast<unsigned>(getpid());
  static int on_busy(void* self, int count) {
    auto* q = static_cast<Impl*>(self);
    auto now = std::chrono::steady_clock::now();
    if (count == 0) q->busy_since = now;
    if (now - q->busy_since >= std::chrono::milliseconds(q->opt.busy_timeout_ms)) return 0;
    q->busy_seed = q->busy_seed * 1103515245u + 12345u;
    usleep(500 + (q->busy_seed >> 16) % 1000);
    return 1;
  }

  [[noreturn]] void raise(int rc, const std::string& what) const {
    std::string msg = "queue " + path + ": " + what + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    int primary = rc & 0xff;
    if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB)
      throw FormatError(msg + " (the file is corrupt or not a corelm queue)");
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
      throw IOError(msg + " (another process held the write lock longer than busy_timeout_ms=" +
                    std::to_string(opt.busy_timeout_ms) + ")");
    if (primary == SQLITE_FULL)
      throw StorageFullError(msg + " (the disk is full or the queue reached max_db_bytes=" +
                             std::to_string(opt.max_db_bytes) + "; nothing of this transaction was stored)");
    if (primary == SQLITE_CONSTRAINT) throw ValueError(msg);
    throw IOError(msg);
  }

  void exec(const char* sql) const {
    char* err = nullptr;
    int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
    if (rc != SQLITE_OK) {
      std::string e = err ? err : sqlite3_errstr(rc);
      sqlite3_free(err);
      raise(rc, std::string("'") + std::string(sql).substr(0, 40) + "' failed (" + e + ")");
    }
  }

  // A cached prepared statement, reset and unbound for reuse.
  sqlite3_stmt* stmt(const char* sql) const {
    auto it = stmts.find(sql);
    if (it != stmts.end()) {
      sqlite3_reset(it->second);
      sqlite3_clear_bindings(it->second);
      return it->second;
    }
    sqlite3_stmt* st = nullptr;
    int rc = sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr);
    if (rc != SQLITE_OK) raise(rc, "prepare");
    stmts.emplace(sql, st);
    return st;
  }

  // A cached statement built by make(n) for n rows (kind < 16 tells the builders apart).
  template <typename Make>
  sqlite3_stmt* sized_stmt(int kind, int64_t n, Make&& make) const {
    const int64_t key = n * 16 + kind;
    auto it = sized_stmts.find(key);
    if (it != sized_stmts.end()) {
      sqlite3_reset(it->second);
      sqlite3_clear_bindings(it->second);
      return it->second;
    }
    const std::string sql = make(n);
    sqlite3_stmt* st = nullptr;
    int rc = sqlite3_prepare_v3(db, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr);
    if (rc != SQLITE_OK) raise(rc, "prepare");
    sized_stmts.emplace(key, st);
    return st;
  }

  void bind(sqlite3_stmt* st, int i, const std::string& s) const {
    sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void bind(sqlite3_stmt* st, int i, const std::optional<std::string>& s) const {
    if (s) bind(st, i, *s);
    else sqlite3_bind_null(st, i);
  }
  // Not copied: only for a string that outlives the step, and the caller clears the bindings
  // before the statement goes back to the cache.
  void bind_static(sqlite3_stmt* st, int i, const std::string& s) const {
    sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
  }
  void bind(sqlite3_stmt* st, int i, int64_t v) const { sqlite3_bind_int64(st, i, v); }
  void bind(sqlite3_stmt* st, int i, double v) const { sqlite3_bind_double(st, i, v); }

  // Steps a statement; true while it yields a row.
  bool step(sqlite3_stmt* st) const {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    sqlite3_reset(st);
    const char* sql = sqlite3_sql(st);
    raise(rc, std::string("statement '") + std::string(sql ? sql : "?").substr(0, 60) + "' failed");
  }
  void run(sqlite3_stmt* st) const {
    while (step(st)) {
    }
  }

  static std::string text(sqlite3_stmt* st, int col) {
    const unsigned char* p = sqlite3_column_text(st, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(st, col)) : std::string();
  }
  static std::optional<std::string> opt_text(sqlite3_stmt* st, int col) {
    if (sqlite3_column_type(st, col) == SQLITE_NULL) return std::nullopt;
    return text(st, col);
  }

  int64_t pragma_int(const char* sql) const {
    sqlite3_stmt* st = stmt(sql);
    int64_t v = step(st) ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return v;
  }

  // Runs one cached statement that yields no row (BEGIN, COMMIT, PRAGMA ... = ...): parsed once,
  // not at every transaction as sqlite3_exec would.
  void run_cached(const char* sql, const char* what) const {
    sqlite3_stmt* st = stmt(sql);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) raise(rc, what);
  }

  // Adds the transaction's state changes to state_counts (before its COMMIT).
  void flush_delta() {
    const std::pair<const char*, int64_t> all[] = {{"queued", delta.queued}, {"running", delta.running},
                                                   {"done", delta.done},     {"failed", delta.failed},
                                                   {"cancelled", delta.cancelled}};
    for (const auto& [state, n] : all) {
      if (n == 0) continue;
      sqlite3_stmt* st = stmt("UPDATE state_counts SET n = n + ? WHERE state = ?");
      bind(st, 1, n);
      sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
      run(st);
    }
    delta = Counts{};
  }

  // BEGIN IMMEDIATE takes the write lock up front, so two processes never both read and then
  // deadlock upgrading; busy_timeout makes the loser wait instead of failing.
  template <typename F>
  auto write(F&& f) {
    delta = Counts{};
    run_cached("BEGIN IMMEDIATE", "BEGIN IMMEDIATE");
    try {
      if constexpr (std::is_void_v<decltype(f())>) {
        f();
        flush_delta();
        run_cached("COMMIT", "COMMIT");
      } else {
        auto r = f();
        flush_delta();
        run_cached("COMMIT", "COMMIT");
        return r;
      }
    } catch (...) {
      delta = Counts{};
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

  int64_t pending() const {
    sqlite3_stmt* st = stmt("SELECT COALESCE(SUM(n),0) FROM state_counts WHERE state IN ('queued','running')");
    int64_t n = step(st) ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return n + delta.queued + delta.running;
  }

  // One results row (request_id, status_code, body, error, finished_at) bound at parameters
  // first .. first + 4, its strings not copied (run_and_clear clears them).
  void bind_result(sqlite3_stmt* st, int first, RequestId id, const Result& r, double t) const {
    bind(st, first, id);
    bind(st, first + 1, r.status_code);
    bind_static(st, first + 2, r.body);
    if (r.error.empty()) sqlite3_bind_null(st, first + 3);
    else bind_static(st, first + 3, r.error);
    bind(st, first + 4, t);
  }
  // Runs a statement with bind_static parameters and clears its bindings, also when it fails.
  void run_and_clear(sqlite3_stmt* st) const {
    try {
      run(st);
    } catch (...) {
      sqlite3_clear_bindings(st);
      throw;
    }
    sqlite3_clear_bindings(st);
  }

  void insert_result(RequestId id, const Result& r, double t) {
    sqlite3_stmt* st = stmt(
        "INSERT INTO results(request_id, status_code, body, error, finished_at) VALUES(?,?,?,?,?)");
    bind_result(st, 1, id, r, t);
    run_and_clear(st);
  }

  RequestId insert_one(const NewRequest& r, double t) {
    if (r.model.empty()) throw ValueError("queue " + path + ": enqueue: model is empty");
    if (!nlohmann::json::accept(r.body))
      throw ValueError("queue " + path + ": enqueue: body is not valid JSON" +
                       (r.custom_id ? " (custom_id " + *r.custom_id + ")" : std::string()));
    if (r.endpoint != "/v1/completions" && r.endpoint != "/v1/chat/completions")
      throw ValueError("queue " + path + ": enqueue: endpoint must be /v1/completions or /v1/chat/completions, got '" +
                       r.endpoint + "'");
    std::string hash = content_hash(r.model, r.body, r.endpoint);
    std::optional<Result> reuse;
    if (opt.dedup) {
      sqlite3_stmt* st = stmt(
          "SELECT s.status_code, s.body, s.error FROM requests r JOIN results s ON s.request_id = r.id "
          "WHERE r.content_hash = ? AND r.state = 'done' AND r.dedup = 1 AND r.model = ? AND r.body = ? AND r.endpoint = ? LIMIT 1");
      bind(st, 1, hash);
      bind(st, 2, r.model);
      bind(st, 3, r.body);
      bind(st, 4, r.endpoint);
      if (step(st)) reuse = Result{sqlite3_column_int64(st, 0), text(st, 1), text(st, 2)};
      sqlite3_reset(st);
    }
    sqlite3_stmt* st = stmt(
        "INSERT INTO requests(batch_id, custom_id, model, body, content_hash, state, created_at, updated_at, endpoint, "
        "dedup) VALUES(?,?,?,?,?,?,?,?,?,?)");
    // Bound without a copy (the strings outlive the step; the bindings are cleared after it).
    if (r.batch_id) bind_static(st, 1, *r.batch_id);
    if (r.custom_id) bind_static(st, 2, *r.custom_id);
    bind_static(st, 3, r.model);
    bind_static(st, 4, r.body);
    bind_static(st, 5, hash);
    sqlite3_bind_text(st, 6, reuse ? "done" : "queued", -1, SQLITE_STATIC);
    bind(st, 7, t);
    bind(st, 8, t);
    bind_static(st, 9, r.endpoint);
    bind(st, 10, static_cast<int64_t>(opt.dedup ? 1 : 0));
    int rc = sqlite3_step(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE) {
      sqlite3_reset(st);
      if ((rc & 0xff) == SQLITE_CONSTRAINT && r.batch_id && r.custom_id)
        throw ValueError("queue " + path + ": duplicate custom_id '" + *r.custom_id + "' in batch " + *r.batch_id);
      raise(rc, "enqueue");
    }
    RequestId id = sqlite3_last_insert_rowid(db);
    if (reuse) {
      ++delta.done;
      insert_result(id, *reuse, t);
    } else {
      ++delta.queued;
    }
    return id;
  }

  // A running request back to queued, or to failed with an error result when its attempts are
  // spent (a request that kills every worker that takes it must not loop forever).
  RequestState release(RequestId id, int64_t attempts, const std::string& error, double t) {
    bool out = attempts >= opt.max_attempts;
    sqlite3_stmt* st = stmt(
        "UPDATE requests SET state = ?, lease_expiry = NULL, worker_id = NULL, worker_pid = NULL, "
        "worker_host = NULL, last_error = ?, updated_at = ? WHERE id = ?");
    bind(st, 1, std::string(out ? "failed" : "queued"));
    bind(st, 2, error);
    bind(st, 3, t);
    bind(st, 4, id);
    run(st);
    --delta.running;
    if (out) {
      ++delta.failed;
      insert_result(id, Result{500, "", "failed after " + std::to_string(attempts) + " attempts; last: " + error}, t);
      return RequestState::failed;
    }
    ++delta.queued;
    return RequestState::queued;
  }

  int64_t reclaim_locked(double t) {
    struct Lost {
      RequestId id;
      int64_t attempts;
      std::string why;
    };
    std::vector<Lost> lost;
    {
      sqlite3_stmt* st = stmt(
          "SELECT id, attempts, worker_id FROM requests WHERE state = 'running' AND lease_expiry < ?");
      bind(st, 1, t);
      while (step(st))
        lost.push_back({sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
                        "lease of worker " + text(st, 2) + " expired"});
      sqlite3_reset(st);
    }
    {
      // This process's own rows are not looked at: it is alive (no kill(2) per lease).
      sqlite3_stmt* st = stmt(
          "SELECT DISTINCT worker_pid FROM requests WHERE state = 'running' AND worker_host = ? AND lease_expiry >= ? "
          "AND worker_pid <> ?");
      bind(st, 1, host);
      bind(st, 2, t);
      bind(st, 3, static_cast<int64_t>(getpid()));
      std::vector<int64_t> dead;
      while (step(st)) {
        int64_t pid = sqlite3_column_int64(st, 0);
        if (pid > 0 && !process_alive(pid)) dead.push_back(pid);
      }
      sqlite3_reset(st);
      for (int64_t pid : dead) {
        sqlite3_stmt* q = stmt(
            "SELECT id, attempts, worker_id FROM requests WHERE state = 'running' AND worker_host = ? "
            "AND worker_pid = ? AND lease_expiry >= ?");
        bind(q, 1, host);
        bind(q, 2, pid);
        bind(q, 3, t);
        while (step(q))
          lost.push_back({sqlite3_column_int64(q, 0), sqlite3_column_int64(q, 1),
                          "worker " + text(q, 2) + " (pid " + std::to_string(pid) + ") is gone"});
        sqlite3_reset(q);
      }
    }
    for (const Lost& l : lost) release(l.id, l.attempts, l.why, t);
    return static_cast<int64_t>(lost.size());
  }

  // Refuses a worker that does not hold the lease; returns the attempts so far.
  int64_t check_holder(RequestId id, const std::string& worker_id, const char* op) {
    sqlite3_stmt* st = stmt("SELECT state, worker_id, attempts FROM requests WHERE id = ?");
    bind(st, 1, id);
    if (!step(st)) {
      sqlite3_reset(st);
      throw IndexError("queue " + path + ": " + op + ": no request " + std::to_string(id));
    }
    std::string state = text(st, 0), holder = text(st, 1);
    int64_t attempts = sqlite3_column_int64(st, 2);
    sqlite3_reset(st);
    if (state != "running" || holder != worker_id)
      throw LeaseLostError("queue " + path + ": " + op + " of request " + std::to_string(id) + " by worker " +
                           worker_id + " refused: the request is " + state +
                           (state == "running" ? " under worker " + holder : std::string()) +
                           " (the lease expired or was reclaimed)");
    return attempts;
  }

  Counts counts_where(const std::optional<std::string>& batch_id) const {
    Counts c;
    sqlite3_stmt* st = batch_id
        ? stmt("SELECT state, COUNT(*) FROM requests WHERE batch_id = ? GROUP BY state")
        : stmt("SELECT state, n FROM state_counts");
    if (batch_id) bind(st, 1, *batch_id);
    while (step(st)) {
      int64_t n = sqlite3_column_int64(st, 1);
      switch (parse_state(text(st, 0), path)) {
        case RequestState::queued: c.queued = n; break;
        case RequestState::running: c.running = n; break;
        case RequestState::done: c.done = n; break;
        case RequestState::failed: c.failed = n; break;
        case RequestState::cancelled: c.cancelled = n; break;
      }
    }
    sqlite3_reset(st);
    return c;
  }

  void mark_done(RequestId id, const Result& result, double t);
  std::vector<LeasedRequest> lease_locked(const std::string& worker_id, int64_t n, double t);
  std::vector<RequestId> complete_locked(const std::string& worker_id,
                                         const std::vector<std::pair<RequestId, Result>>& results, double t);
  FileInfo file_row(sqlite3_stmt* st) const;
  BatchInfo batch_row(sqlite3_stmt* st) const;
  BatchCounts batch_counts(const std::string& batch_id) const;
  bool set_status(const std::string& id, BatchStatus from, BatchStatus to, double t);
  std::optional<BatchInfo> find_batch(const std::string& id, bool with_counts = true) const;
  int64_t check_identity() const;
  void migrate();
};

// Brings the file to kSchemaVersion inside one write transaction, so two processes opening a new
// file at once create the schema once. Version 0 with no tables is a new file.
int64_t Queue::Impl::check_identity() const {
  int64_t version = pragma_int("PRAGMA user_version");
  int64_t app = pragma_int("PRAGMA application_id");
  int64_t tables = pragma_int("SELECT COUNT(*) FROM sqlite_schema");
  if (version > kSchemaVersion && app == kApplicationId)
    throw FormatError("queue " + path + ": schema version " + std::to_string(version) +
                      " is newer than this corelm knows (" + std::to_string(kSchemaVersion) +
                      "); open it with a newer corelm");
  if (app != kApplicationId && (app != 0 || version != 0 || tables != 0))
    throw FormatError("queue " + path + ": a SQLite database of another application (application_id " +
                      std::to_string(app) + ", user_version " + std::to_string(version) + ", " +
                      std::to_string(tables) +
                      " schema objects), not a corelm queue; move it or choose another --state-dir");
  return version;
}

void Queue::Impl::migrate() {
  write([&] {
    int64_t version = check_identity();
    if (version == 0) {
      exec(kSchemaV1);
      exec(("PRAGMA application_id = " + std::to_string(kApplicationId)).c_str());
      exec("PRAGMA user_version = 1");
      version = 1;
    }
    if (version == 1) {
      exec(kMigrateV1toV2);
      exec("PRAGMA user_version = 2");
      version = 2;
    }
    if (version == 2) {
      exec(kMigrateV2toV3);
      exec("PRAGMA user_version = 3");
      version = 3;
    }
    if (version == 3) {
      exec(kMigrateV3toV4);
      exec("PRAGMA user_version = 4");
      version = 4;
    }
  });
}

Queue::Queue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Queue::Queue(Queue&&) noexcept = default;
Queue& Queue::operator=(Queue&&) noexcept = default;
Queue::~Queue() = default;

Queue Queue::open(const std::string& path, const QueueOptions& options) {
  if (options.max_requests < 1) throw ValueError("queue: max_requests must be >= 1");
  if (!(options.lease_seconds > 0)) throw ValueError("queue: lease_seconds must be > 0");
  if (options.max_attempts < 1) throw ValueError("queue: max_attempts must be >= 1");
  if (options.busy_timeout_ms < 0) throw ValueError("queue: busy_timeout_ms must be >= 0");
  if (options.max_db_bytes < 0) throw ValueError("queue: max_db_bytes must be >= 0");
  namespace fs = std::filesystem;
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    throw IOError("queue " + path + ": folder " + parent.string() + " does not exist");
  // SQLite would report a foreign file only at the first query, as "file is not a database";
  // the header check names what the file is instead.
  std::error_code ec;
  if (fs::exists(path, ec) && fs::file_size(path, ec) > 0) {
    std::ifstream in(path, std::ios::binary);
    char head[16] = {0};
    in.read(head, sizeof head);
    if (!in || std::memcmp(head, "SQLite format 3", 16) != 0)
      throw FormatError("queue " + path + ": not a SQLite database (the file does not start with the "
                        "SQLite header); move it or choose another --state-dir");
  }
  // Once per process, before SQLite initializes: no memory statistics (they take a global mutex
  // at every malloc and free inside SQLite; nothing here reads them). A process that started
  // SQLite before (SQLITE_MISUSE) keeps the defaults: only slower.
  static std::once_flag configured;
  std::call_once(configured, [] { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); });
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->opt = options;
  int rc = sqlite3_open_v2(path.c_str(), &impl->db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) impl->raise(rc, "cannot open");
  sqlite3_extended_result_codes(impl->db, 1);
  // A larger lookaside (SQLite's per-connection allocator for small objects: cursors, records,
  // statement state) than the default 100 x 1,200 bytes: an ack group's statements allocate past it.
  sqlite3_db_config(impl->db, SQLITE_DBCONFIG_LOOKASIDE, nullptr, 1200, 500);
  sqlite3_busy_handler(impl->db, &Impl::on_busy, impl.get());
  // Before anything writes (switching to WAL rewrites the header): never touch a foreign file.
  // One read transaction, so the header and schema reads see one snapshot: read one by one, a
  // process creating the file at the same moment could commit in between (tables there, the
  // application id not yet), which looked like another program's file.
  impl->exec("BEGIN");
  try {
    impl->check_identity();
  } catch (...) {
    sqlite3_exec(impl->db, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  impl->exec("COMMIT");
  {
    // The switch to WAL takes an exclusive lock and, when another process holds the file at that
    // moment (two servers opening one new state dir at once), SQLite answers SQLITE_BUSY at once,
    // without the busy handler: retried here, paced and timed out by that same handler.
    std::string mode;
    for (int tries = 0;; ++tries) {
      sqlite3_stmt* st = impl->stmt("PRAGMA journal_mode = WAL");
      const int rc = sqlite3_step(st);
      if (rc == SQLITE_ROW) mode = Impl::text(st, 0);
      sqlite3_reset(st);
      if (rc == SQLITE_ROW || rc == SQLITE_DONE) break;
      if ((rc & 0xff) != SQLITE_BUSY || !Impl::on_busy(impl.get(), tries))
        impl->raise(rc, "statement 'PRAGMA journal_mode = WAL' failed");
    }
    if (mode != "wal") throw IOError("queue " + path + ": cannot switch to WAL mode (got '" + mode + "')");
  }
  impl->exec(options.sync == Sync::full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
  impl->exec("PRAGMA foreign_keys = ON");
  impl->migrate();
  if (options.max_db_bytes > 0) {
    // max_page_count is per connection and never below the current size: a cap smaller than
    // the file only refuses growth.
    int64_t page = impl->pragma_int("PRAGMA page_size");
    int64_t pages = std::max<int64_t>(1, options.max_db_bytes / std::max<int64_t>(page, 1));
    impl->exec(("PRAGMA max_page_count = " + std::to_string(pages)).c_str());
  }
  return Queue(std::move(impl));
}

int64_t Queue::schema_version() const {
  std::lock_guard lk(impl_->mu);
  return impl_->pragma_int("PRAGMA user_version");
}

const std::string& Queue::path() const { return impl_->path; }

RequestId Queue::enqueue(const std::string& model, const std::string& body_json,
                         const std::optional<std::string>& batch_id, const std::optional<std::string>& custom_id,
                         const std::string& endpoint) {
  return enqueue_many({NewRequest{model, body_json, batch_id, custom_id, endpoint}}).front();
}

std::vector<RequestId> Queue::enqueue_many(const std::vector<NewRequest>& requests) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    int64_t pending = q.pending();
    if (pending + static_cast<int64_t>(requests.size()) > q.opt.max_requests)
      throw QueueFullError("queue " + q.path + " is full: " + std::to_string(pending) + " requests queued or running, max_requests " +
                           std::to_string(q.opt.max_requests) + "; " + std::to_string(requests.size()) +
                           " more do not fit (retry later)");
    double t = now_seconds();
    std::vector<RequestId> ids;
    ids.reserve(requests.size());
    for (const NewRequest& r : requests) ids.push_back(q.insert_one(r, t));
    return ids;
  });
}

// One statement for the whole lease (not a SELECT and an UPDATE per row): the rows are chosen,
// marked and read back in one pass. RETURNING gives the updated attempts and no order, hence the
// sort.
std::vector<LeasedRequest> Queue::Impl::lease_locked(const std::string& worker_id, int64_t n, double t) {
  reclaim_locked(t);
  std::vector<LeasedRequest> out;
  sqlite3_stmt* st = stmt(
      "UPDATE requests SET state = 'running', attempts = attempts + 1, lease_expiry = ?, worker_id = ?, "
      "worker_pid = ?, worker_host = ?, updated_at = ? "
      "WHERE id IN (SELECT id FROM requests WHERE state = 'queued' ORDER BY id LIMIT ?) "
      "RETURNING id, model, body, batch_id, custom_id, attempts, endpoint");
  bind(st, 1, t + opt.lease_seconds);
  bind(st, 2, worker_id);
  bind(st, 3, static_cast<int64_t>(getpid()));
  bind(st, 4, host);
  bind(st, 5, t);
  bind(st, 6, n);
  out.reserve(static_cast<size_t>(std::min<int64_t>(n, 4096)));
  while (step(st))
    out.push_back({sqlite3_column_int64(st, 0), text(st, 1), text(st, 2), opt_text(st, 3), opt_text(st, 4),
                   sqlite3_column_int64(st, 5), text(st, 6)});
  sqlite3_reset(st);
  delta.queued -= static_cast<int64_t>(out.size());
  delta.running += static_cast<int64_t>(out.size());
  std::sort(out.begin(), out.end(), [](const LeasedRequest& x, const LeasedRequest& y) { return x.id < y.id; });
  return out;
}

// The holder check and the state change in one UPDATE for up to kAckChunk rows, their results
// in one multi-row INSERT (per row: one UPDATE and one INSERT statement before, whose fixed cost
// per statement was most of an ack's). Rows in id order, so the results B-tree is appended to.
// Only a row the UPDATE does not return is looked at again, to tell a lost lease (skipped and
// returned) from an unknown id (IndexError, as complete()). An id given twice: the first one
// counts, the later ones are refused (their lease is no longer held once the first is done).
std::vector<RequestId> Queue::Impl::complete_locked(const std::string& worker_id,
                                                    const std::vector<std::pair<RequestId, Result>>& results, double t) {
  constexpr size_t kAckChunk = 32;
  std::vector<RequestId> refused;
  std::vector<size_t> order(results.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return results[a].first < results[b].first; });
  std::vector<size_t> chunk, acked;
  chunk.reserve(kAckChunk);
  acked.reserve(kAckChunk);
  std::vector<RequestId> returned;
  for (size_t at = 0; at < order.size();) {
    chunk.clear();
    for (; at < order.size() && chunk.size() < kAckChunk; ++at) {
      if (!chunk.empty() && results[order[at]].first == results[chunk.back()].first) {
        refused.push_back(results[order[at]].first);
        continue;
      }
      chunk.push_back(order[at]);
    }
    if (chunk.empty()) continue;
    const auto n = static_cast<int64_t>(chunk.size());
    sqlite3_stmt* up = sized_stmt(0, n, [](int64_t k) {
      std::string sql =
          "UPDATE requests SET state = 'done', lease_expiry = NULL, updated_at = ?1 "
          "WHERE state = 'running' AND worker_id = ?2 AND id IN (?3";
      for (int64_t i = 1; i < k; ++i) sql += ",?" + std::to_string(i + 3);
      return sql + ") RETURNING id";
    });
    bind(up, 1, t);
    bind_static(up, 2, worker_id);
    for (int64_t i = 0; i < n; ++i) bind(up, static_cast<int>(i + 3), results[chunk[static_cast<size_t>(i)]].first);
    returned.clear();
    try {
      while (step(up)) returned.push_back(sqlite3_column_int64(up, 0));
    } catch (...) {
      sqlite3_clear_bindings(up);
      throw;
    }
    sqlite3_reset(up);
    sqlite3_clear_bindings(up);
    std::sort(returned.begin(), returned.end());
    acked.clear();
    for (size_t i : chunk) {
      const RequestId id = results[i].first;
      if (std::binary_search(returned.begin(), returned.end(), id)) {
        acked.push_back(i);
        continue;
      }
      try {
        check_holder(id, worker_id, "complete");
      } catch (const LeaseLostError&) {
        refused.push_back(id);
        continue;
      }
      // Not reached: a held lease matches the UPDATE above.
      mark_done(id, results[i].second, t);
    }
    if (acked.empty()) continue;
    const auto m = static_cast<int64_t>(acked.size());
    delta.running -= m;
    delta.done += m;
    sqlite3_stmt* ins = sized_stmt(1, m, [](int64_t k) {
      std::string sql = "INSERT INTO results(request_id, status_code, body, error, finished_at) VALUES(?,?,?,?,?)";
      for (int64_t i = 1; i < k; ++i) sql += ",(?,?,?,?,?)";
      return sql;
    });
    int c = 1;
    for (size_t i : acked) {
      bind_result(ins, c, results[i].first, results[i].second, t);
      c += 5;
    }
    run_and_clear(ins);
  }
  return refused;
}

static void check_lease_args(const std::string& worker_id, int64_t n) {
  if (worker_id.empty()) throw ValueError("queue: lease: worker_id is empty");
  if (n < 1) throw ValueError("queue: lease: n must be >= 1, got " + std::to_string(n));
}

// A lease is committed without an fsync even under Sync::full: a lease lost to a power cut only
// puts its rows back to queued (their holder is gone too), and the next synchronous commit (an
// ack) fsyncs the WAL with the lease's frames before it. Acks keep their fsync, so a result is
// still on disk when complete() returns; a worker pays one fsync per ack group, not two.
std::vector<LeasedRequest> Queue::lease(const std::string& worker_id, int64_t n) {
  check_lease_args(worker_id, n);
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  const bool relax = q.opt.sync == Sync::full;
  if (relax) q.run_cached("PRAGMA synchronous = NORMAL", "PRAGMA synchronous");
  try {
    auto out = q.write([&] { return q.lease_locked(worker_id, n, now_seconds()); });
    if (relax) q.run_cached("PRAGMA synchronous = FULL", "PRAGMA synchronous");
    return out;
  } catch (...) {
    if (relax) sqlite3_exec(q.db, "PRAGMA synchronous = FULL", nullptr, nullptr, nullptr);
    throw;
  }
}

void Queue::Impl::mark_done(RequestId id, const Result& result, double t) {
  sqlite3_stmt* st = stmt("UPDATE requests SET state = 'done', lease_expiry = NULL, updated_at = ? WHERE id = ?");
  bind(st, 1, t);
  bind(st, 2, id);
  run(st);
  --delta.running;  // check_holder saw it running
  ++delta.done;
  insert_result(id, result, t);
}

void Queue::complete(RequestId id, const std::string& worker_id, const Result& result) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  q.write([&] {
    q.check_holder(id, worker_id, "complete");
    q.mark_done(id, result, now_seconds());
  });
}

std::vector<RequestId> Queue::complete_many(const std::string& worker_id,
                                            const std::vector<std::pair<RequestId, Result>>& results) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] { return q.complete_locked(worker_id, results, now_seconds()); });
}

// The acks first, then the lease: a row acked here is done before the lease looks for queued
// rows, and the lease's reclaim cannot take back a row this call just acked.
AckAndLease Queue::complete_and_lease(const std::string& worker_id,
                                      const std::vector<std::pair<RequestId, Result>>& results, int64_t n) {
  if (n < 0) throw ValueError("queue: complete_and_lease: n must be >= 0, got " + std::to_string(n));
  if (n > 0) check_lease_args(worker_id, n);
  if (results.empty()) return {{}, n > 0 ? lease(worker_id, n) : std::vector<LeasedRequest>{}};  // no fsync needed
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    const double t = now_seconds();
    AckAndLease out;
    out.refused = q.complete_locked(worker_id, results, t);
    if (n > 0) out.leased = q.lease_locked(worker_id, n, t);
    return out;
  });
}

RequestState Queue::fail(RequestId id, const std::string& worker_id, const std::string& error) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    int64_t attempts = q.check_holder(id, worker_id, "fail");
    return q.release(id, attempts, error, now_seconds());
  });
}

int64_t Queue::renew(const std::string& worker_id) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    double t = now_seconds();
    sqlite3_stmt* st = q.stmt(
        "UPDATE requests SET lease_expiry = ?, updated_at = ? WHERE state = 'running' AND worker_id = ? "
        "AND lease_expiry >= ?");
    q.bind(st, 1, t + q.opt.lease_seconds);
    q.bind(st, 2, t);
    q.bind(st, 3, worker_id);
    q.bind(st, 4, t);
    q.run(st);
    return static_cast<int64_t>(sqlite3_changes(q.db));
  });
}

int64_t Queue::reclaim() {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] { return q.reclaim_locked(now_seconds()); });
}

std::optional<RequestInfo> Queue::get(RequestId id) const {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  sqlite3_stmt* st = q.stmt(
      "SELECT r.state, r.attempts, r.model, r.batch_id, r.custom_id, r.worker_id, "
      "s.request_id IS NOT NULL, s.status_code, s.body, s.error, r.endpoint "
      "FROM requests r LEFT JOIN results s ON s.request_id = r.id WHERE r.id = ?");
  q.bind(st, 1, id);
  if (!q.step(st)) {
    sqlite3_reset(st);
    return std::nullopt;
  }
  RequestInfo info;
  info.id = id;
  info.state = parse_state(Impl::text(st, 0), q.path);
  info.attempts = sqlite3_column_int64(st, 1);
  info.model = Impl::text(st, 2);
  info.batch_id = Impl::opt_text(st, 3);
  info.custom_id = Impl::opt_text(st, 4);
  info.worker_id = Impl::text(st, 5);
  if (sqlite3_column_int64(st, 6))
    info.result = Result{sqlite3_column_int64(st, 7), Impl::text(st, 8), Impl::text(st, 9)};
  info.endpoint = Impl::text(st, 10);
  sqlite3_reset(st);
  return info;
}

Counts Queue::counts() const {
  std::lock_guard lk(impl_->mu);
  return impl_->counts_where(std::nullopt);
}

Counts Queue::counts(const std::string& batch_id) const {
  std::lock_guard lk(impl_->mu);
  return impl_->counts_where(batch_id);
}

int64_t Queue::cancel_batch(const std::string& batch_id) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    // The IN term names requests_batch_pending's condition, so the planner ranges over that index.
    sqlite3_stmt* st = q.stmt(
        "UPDATE requests SET state = 'cancelled', updated_at = ? "
        "WHERE batch_id = ? AND state IN ('queued','running') AND state = 'queued'");
    q.bind(st, 1, now_seconds());
    q.bind(st, 2, batch_id);
    q.run(st);
    const auto n = static_cast<int64_t>(sqlite3_changes(q.db));
    q.delta.queued -= n;
    q.delta.cancelled += n;
    return n;
  });
}

}  // namespace corelm::queue

// ---- Files and batches ----------------------------------------------------------------------

namespace corelm::queue {
namespace {

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^
                                          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  static const char* digits = "0123456789abcdef";
  std::string out(n, '0');
  for (char& c : out) c = digits[rng() & 15];
  return out;
}

const char* kind_name(FileKind k) {
  switch (k) {
    case FileKind::upload: return "upload";
    case FileKind::output: return "output";
    case FileKind::error: return "error";
  }
  return "upload";
}

FileKind parse_kind(const std::string& s) {
  if (s == "output") return FileKind::output;
  if (s == "error") return FileKind::error;
  return FileKind::upload;
}

BatchStatus parse_batch_status(const std::string& s, const std::string& path) {
  static const std::pair<const char*, BatchStatus> all[] = {
      {"validating", BatchStatus::validating}, {"failed", BatchStatus::failed},
      {"in_progress", BatchStatus::in_progress}, {"finalizing", BatchStatus::finalizing},
      {"completed", BatchStatus::completed},   {"expired", BatchStatus::expired},
      {"cancelling", BatchStatus::cancelling}, {"cancelled", BatchStatus::cancelled}};
  for (const auto& [name, st] : all)
    if (s == name) return st;
  throw FormatError("queue " + path + ": unknown batch status '" + s + "'");
}

// The *_at column a status sets when a batch enters it (validating has created_at).
const char* status_time_column(BatchStatus s) {
  switch (s) {
    case BatchStatus::validating: return nullptr;
    case BatchStatus::failed: return "failed_at";
    case BatchStatus::in_progress: return "in_progress_at";
    case BatchStatus::finalizing: return "finalizing_at";
    case BatchStatus::completed: return "completed_at";
    case BatchStatus::expired: return "expired_at";
    case BatchStatus::cancelling: return "cancelling_at";
    case BatchStatus::cancelled: return "cancelled_at";
  }
  return nullptr;
}

std::optional<double> opt_real(sqlite3_stmt* st, int col) {
  if (sqlite3_column_type(st, col) == SQLITE_NULL) return std::nullopt;
  return sqlite3_column_double(st, col);
}

}  // namespace

const char* to_string(BatchStatus s) {
  switch (s) {
    case BatchStatus::validating: return "validating";
    case BatchStatus::failed: return "failed";
    case BatchStatus::in_progress: return "in_progress";
    case BatchStatus::finalizing: return "finalizing";
    case BatchStatus::completed: return "completed";
    case BatchStatus::expired: return "expired";
    case BatchStatus::cancelling: return "cancelling";
    case BatchStatus::cancelled: return "cancelled";
  }
  return "?";
}

bool is_terminal(BatchStatus s) {
  return s == BatchStatus::failed || s == BatchStatus::completed || s == BatchStatus::expired ||
         s == BatchStatus::cancelled;
}

// ---- Impl helpers (under mu) ----

FileInfo Queue::Impl::file_row(sqlite3_stmt* st) const {
  FileInfo f;
  f.id = text(st, 0);
  f.purpose = text(st, 1);
  f.filename = text(st, 2);
  f.bytes = sqlite3_column_int64(st, 3);
  f.created_at = sqlite3_column_double(st, 4);
  f.kind = parse_kind(text(st, 5));
  f.batch_id = opt_text(st, 6);
  return f;
}

BatchCounts Queue::Impl::batch_counts(const std::string& batch_id) const {
  sqlite3_stmt* st = stmt(
      "SELECT COUNT(*), COALESCE(SUM(r.state = 'done' AND s.status_code = 200), 0), "
      "COALESCE(SUM(r.state IN ('failed','cancelled') OR (r.state = 'done' AND s.status_code <> 200)), 0) "
      "FROM requests r LEFT JOIN results s ON s.request_id = r.id WHERE r.batch_id = ?");
  bind(st, 1, batch_id);
  BatchCounts c;
  if (step(st)) c = {sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1), sqlite3_column_int64(st, 2)};
  sqlite3_reset(st);
  return c;
}

// Reads one batches row (find_batch's columns); a finished batch's counts are the frozen ones.
BatchInfo Queue::Impl::batch_row(sqlite3_stmt* st) const {
  BatchInfo b;
  b.id = text(st, 0);
  b.input_file_id = text(st, 1);
  b.endpoint = text(st, 2);
  b.completion_window = text(st, 3);
  b.metadata = text(st, 4);
  b.status = parse_batch_status(text(st, 5), path);
  b.output_file_id = opt_text(st, 6);
  b.error_file_id = opt_text(st, 7);
  b.errors = text(st, 8);
  b.created_at = sqlite3_column_double(st, 9);
  b.in_progress_at = opt_real(st, 10);
  b.expires_at = opt_real(st, 11);
  b.finalizing_at = opt_real(st, 12);
  b.completed_at = opt_real(st, 13);
  b.failed_at = opt_real(st, 14);
  b.expired_at = opt_real(st, 15);
  b.cancelling_at = opt_real(st, 16);
  b.cancelled_at = opt_real(st, 17);
  if (sqlite3_column_type(st, 18) != SQLITE_NULL)
    b.counts = {sqlite3_column_int64(st, 18), sqlite3_column_int64(st, 19), sqlite3_column_int64(st, 20)};
  else
    b.counts.total = -1;  // filled by the caller after the statement is reset
  return b;
}

// The conditional UPDATE every transition is: it happens only when the batch is still in `from`,
// so two monitors racing on one batch move it once. Entering a final status freezes the counts.
bool Queue::Impl::set_status(const std::string& id, BatchStatus from, BatchStatus to, double t) {
  std::string sql = std::string("UPDATE batches SET status = ?, updated_at = ?") +
                    (status_time_column(to) ? std::string(", ") + status_time_column(to) + " = ?" : std::string()) +
                    " WHERE id = ? AND status = ?";
  sqlite3_stmt* st = nullptr;
  int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr);
  if (rc != SQLITE_OK) raise(rc, "prepare");
  int i = 1;
  bind(st, i++, std::string(to_string(to)));
  bind(st, i++, t);
  if (status_time_column(to)) bind(st, i++, t);
  bind(st, i++, id);
  bind(st, i++, std::string(to_string(from)));
  rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) raise(rc, "batch " + id + ": " + to_string(from) + " -> " + to_string(to));
  if (sqlite3_changes(db) == 0) return false;
  if (is_terminal(to)) {
    BatchCounts c = batch_counts(id);
    sqlite3_stmt* u = stmt(
        "UPDATE batches SET request_total = ?, request_completed = ?, request_failed = ? WHERE id = ?");
    bind(u, 1, c.total);
    bind(u, 2, c.completed);
    bind(u, 3, c.failed);
    bind(u, 4, id);
    run(u);
  }
  return true;
}

std::optional<BatchInfo> Queue::Impl::find_batch(const std::string& id, bool with_counts) const {
  sqlite3_stmt* st = stmt(
      "SELECT id, input_file_id, endpoint, completion_window, metadata, status, output_file_id, error_file_id, errors, "
      "created_at, in_progress_at, expires_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, "
      "cancelled_at, request_total, request_completed, request_failed FROM batches WHERE id = ?");
  bind(st, 1, id);
  if (!step(st)) {
    sqlite3_reset(st);
    return std::nullopt;
  }
  BatchInfo b = batch_row(st);
  sqlite3_reset(st);
  if (b.counts.total < 0) b.counts = with_counts ? batch_counts(b.id) : BatchCounts{};
  return b;
}

// ---- Files ----

FileInfo Queue::add_file(const std::string& purpose, const std::string& filename, const std::string& content) {
  if (purpose.empty()) throw ValueError("queue: add_file: purpose is empty");
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  FileInfo f;
  f.id = "file-" + random_hex(24);
  f.purpose = purpose;
  f.filename = filename;
  f.bytes = static_cast<int64_t>(content.size());
  f.created_at = now_seconds();
  q.write([&] {
    sqlite3_stmt* st = q.stmt(
        "INSERT INTO files(id, purpose, filename, bytes, content, status, created_at, kind) "
        "VALUES(?,?,?,?,?,'processed',?,'upload')");
    q.bind(st, 1, f.id);
    q.bind(st, 2, f.purpose);
    q.bind(st, 3, f.filename);
    q.bind(st, 4, f.bytes);
    sqlite3_bind_blob64(st, 5, content.data(), content.size(), SQLITE_STATIC);
    q.bind(st, 6, f.created_at);
    q.run(st);
    sqlite3_clear_bindings(st);  // the blob is not ours past this call
  });
  return f;
}

std::optional<FileInfo> Queue::get_file(const std::string& id) const {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  sqlite3_stmt* st = q.stmt("SELECT id, purpose, filename, bytes, created_at, kind, batch_id FROM files WHERE id = ?");
  q.bind(st, 1, id);
  std::optional<FileInfo> f;
  if (q.step(st)) f = q.file_row(st);
  sqlite3_reset(st);
  return f;
}

std::optional<std::string> Queue::file_content(const std::string& id) const {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  sqlite3_stmt* st = q.stmt("SELECT content FROM files WHERE id = ? AND kind = 'upload'");
  q.bind(st, 1, id);
  std::optional<std::string> out;
  if (q.step(st)) {
    const void* p = sqlite3_column_blob(st, 0);
    out = std::string(p ? static_cast<const char*>(p) : "", static_cast<size_t>(sqlite3_column_bytes(st, 0)));
  }
  sqlite3_reset(st);
  return out;
}

bool Queue::delete_file(const std::string& id) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    sqlite3_stmt* st = q.stmt("SELECT kind, batch_id FROM files WHERE id = ?");
    q.bind(st, 1, id);
    if (!q.step(st)) {
      sqlite3_reset(st);
      return false;
    }
    FileKind kind = parse_kind(Impl::text(st, 0));
    std::optional<std::string> batch = Impl::opt_text(st, 1);
    sqlite3_reset(st);
    sqlite3_stmt* d = q.stmt("DELETE FROM files WHERE id = ?");
    q.bind(d, 1, id);
    q.run(d);
    if (kind != FileKind::upload && batch) {
      sqlite3_stmt* left = q.stmt("SELECT COUNT(*) FROM files WHERE batch_id = ?");
      q.bind(left, 1, *batch);
      int64_t n = q.step(left) ? sqlite3_column_int64(left, 0) : 0;
      sqlite3_reset(left);
      if (n == 0) {
        sqlite3_stmt* r = q.stmt(
            "DELETE FROM results WHERE request_id IN (SELECT id FROM requests WHERE batch_id = ?)");
        q.bind(r, 1, *batch);
        q.run(r);
        sqlite3_stmt* rq = q.stmt("DELETE FROM requests WHERE batch_id = ?");
        q.bind(rq, 1, *batch);
        q.run(rq);
      }
    }
    return true;
  });
}

std::vector<FileInfo> Queue::list_files(const std::optional<std::string>& after, int64_t limit) const {
  if (limit < 1 || limit > 100000) throw ValueError("queue: list_files: limit must be in 1..100000, got " + std::to_string(limit));
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  sqlite3_stmt* st = after
      ? q.stmt("SELECT id, purpose, filename, bytes, created_at, kind, batch_id FROM files "
               "WHERE (created_at, id) < (SELECT created_at, id FROM files WHERE id = ?) "
               "ORDER BY created_at DESC, id DESC LIMIT ?")
      : q.stmt("SELECT id, purpose, filename, bytes, created_at, kind, batch_id FROM files "
               "ORDER BY created_at DESC, id DESC LIMIT ?");
  int i = 1;
  if (after) q.bind(st, i++, *after);
  q.bind(st, i, limit);
  std::vector<FileInfo> out;
  while (q.step(st)) out.push_back(q.file_row(st));
  sqlite3_reset(st);
  return out;
}

// ---- Batches ----

BatchInfo Queue::create_batch(const std::string& input_file_id, const std::string& endpoint,
                              const std::string& completion_window, const std::string& metadata_json) {
  if (endpoint != "/v1/completions" && endpoint != "/v1/chat/completions")
    throw ValueError("batch endpoint must be /v1/completions or /v1/chat/completions, got '" + endpoint + "'");
  static const std::regex window_re("([1-9][0-9]{0,3})h");
  std::smatch m;
  if (!std::regex_match(completion_window, m, window_re) || std::stoi(m[1].str()) > 8760)
    throw ValueError("batch completion_window must be \"<N>h\" with 1 <= N <= 8760 (e.g. \"24h\"), got '" +
                     completion_window + "'");
  double window_s = std::stoi(m[1].str()) * 3600.0;
  std::string metadata;
  if (!metadata_json.empty()) {
    nlohmann::json md;
    try {
      md = nlohmann::json::parse(metadata_json);
    } catch (const nlohmann::json::parse_error& e) {
      throw ValueError(std::string("batch metadata is not valid JSON: ") + e.what());
    }
    if (!md.is_null()) {
      if (!md.is_object()) throw ValueError("batch metadata must be an object of strings or null");
      if (md.size() > 16) throw ValueError("batch metadata has " + std::to_string(md.size()) + " keys, above the limit of 16");
      for (const auto& [k, v] : md.items()) {
        if (k.size() > 64) throw ValueError("batch metadata key '" + k.substr(0, 64) + "...' is longer than 64 characters");
        if (!v.is_string()) throw ValueError("batch metadata value of '" + k + "' must be a string");
        if (v.get_ref<const std::string&>().size() > 512)
          throw ValueError("batch metadata value of '" + k + "' is longer than 512 characters");
      }
      metadata = md.dump();
    }
  }
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    sqlite3_stmt* f = q.stmt("SELECT kind, purpose FROM files WHERE id = ?");
    q.bind(f, 1, input_file_id);
    if (!q.step(f)) {
      sqlite3_reset(f);
      throw NotFoundError("No such File object: " + input_file_id);
    }
    std::string kind = Impl::text(f, 0), purpose = Impl::text(f, 1);
    sqlite3_reset(f);
    if (kind != "upload" || purpose != "batch")
      throw ValueError("input_file_id " + input_file_id + " has purpose '" + purpose +
                       "'; a batch's input file must be uploaded with purpose 'batch'");
    double t = now_seconds();
    std::string id = "batch_" + random_hex(24);
    sqlite3_stmt* st = q.stmt(
        "INSERT INTO batches(id, input_file_id, endpoint, completion_window, metadata, status, created_at, "
        "updated_at, expires_at) VALUES(?,?,?,?,?,'validating',?,?,?)");
    q.bind(st, 1, id);
    q.bind(st, 2, input_file_id);
    q.bind(st, 3, endpoint);
    q.bind(st, 4, completion_window);
    if (metadata.empty()) sqlite3_bind_null(st, 5);
    else q.bind(st, 5, metadata);
    q.bind(st, 6, t);
    q.bind(st, 7, t);
    q.bind(st, 8, t + window_s);
    q.run(st);
    return *q.find_batch(id);
  });
}

std::optional<BatchInfo> Queue::get_batch(const std::string& id, bool with_counts) const {
  std::lock_guard lk(impl_->mu);
  return impl_->find_batch(id, with_counts);
}

int64_t Queue::pending_in_batch(const std::string& batch_id) const {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  sqlite3_stmt* st = q.stmt("SELECT COUNT(*) FROM requests WHERE batch_id = ? AND state IN ('queued','running')");
  q.bind(st, 1, batch_id);
  int64_t n = q.step(st) ? sqlite3_column_int64(st, 0) : 0;
  sqlite3_reset(st);
  return n;
}

std::vector<BatchInfo> Queue::list_batches(const std::optional<std::string>& after, int64_t limit) const {
  if (limit < 1 || limit > 1000) throw ValueError("queue: list_batches: limit must be in 1..1000, got " + std::to_string(limit));
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  sqlite3_stmt* st = after
      ? q.stmt("SELECT id FROM batches WHERE (created_at, id) < (SELECT created_at, id FROM batches WHERE id = ?) "
               "ORDER BY created_at DESC, id DESC LIMIT ?")
      : q.stmt("SELECT id FROM batches ORDER BY created_at DESC, id DESC LIMIT ?");
  int i = 1;
  if (after) q.bind(st, i++, *after);
  q.bind(st, i, limit);
  std::vector<std::string> ids;
  while (q.step(st)) ids.push_back(Impl::text(st, 0));
  sqlite3_reset(st);
  std::vector<BatchInfo> out;
  for (const std::string& id : ids)
    if (auto b = q.find_batch(id)) out.push_back(std::move(*b));
  return out;
}

bool Queue::start_batch(const std::string& batch_id, std::vector<NewRequest> requests) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    sqlite3_stmt* st = q.stmt("SELECT status FROM batches WHERE id = ?");
    q.bind(st, 1, batch_id);
    if (!q.step(st)) {
      sqlite3_reset(st);
      throw NotFoundError("No such Batch object: " + batch_id);
    }
    std::string status = Impl::text(st, 0);
    sqlite3_reset(st);
    if (status != "validating") return false;
    int64_t pending = q.pending();
    if (pending + static_cast<int64_t>(requests.size()) > q.opt.max_requests)
      throw QueueFullError("queue " + q.path + " is full: " + std::to_string(pending) +
                           " requests queued or running, max_requests " + std::to_string(q.opt.max_requests) +
                           "; the " + std::to_string(requests.size()) + " requests of batch " + batch_id +
                           " do not fit (it starts when they do)");
    double t = now_seconds();
    for (NewRequest& r : requests) {
      r.batch_id = batch_id;
      q.insert_one(r, t);
    }
    return q.set_status(batch_id, BatchStatus::validating, BatchStatus::in_progress, t);
  });
}

bool Queue::fail_batch(const std::string& batch_id, const std::string& errors_json) {
  if (!nlohmann::json::accept(errors_json)) throw ValueError("queue: fail_batch: errors are not valid JSON");
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    double t = now_seconds();
    bool moved = q.set_status(batch_id, BatchStatus::validating, BatchStatus::failed, t) ||
                 q.set_status(batch_id, BatchStatus::in_progress, BatchStatus::failed, t);
    if (moved) {
      sqlite3_stmt* st = q.stmt("UPDATE batches SET errors = ? WHERE id = ?");
      q.bind(st, 1, errors_json);
      q.bind(st, 2, batch_id);
      q.run(st);
    }
    return moved;
  });
}

bool Queue::transition_batch(const std::string& batch_id, BatchStatus from, BatchStatus to) {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] { return q.set_status(batch_id, from, to, now_seconds()); });
}

bool Queue::finish_batch(const std::string& batch_id, BatchStatus from, BatchStatus to, int64_t output_bytes,
                         int64_t error_bytes) {
  if (to != BatchStatus::completed && to != BatchStatus::cancelled && to != BatchStatus::expired)
    throw ValueError(std::string("queue: finish_batch: target must be completed, cancelled or expired, got ") + to_string(to));
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  return q.write([&] {
    double t = now_seconds();
    if (!q.set_status(batch_id, from, to, t)) return false;
    auto add = [&](FileKind kind, int64_t bytes) -> std::optional<std::string> {
      if (bytes < 0) return std::nullopt;
      std::string id = "file-" + random_hex(24);
      sqlite3_stmt* st = q.stmt(
          "INSERT INTO files(id, purpose, filename, bytes, content, status, created_at, kind, batch_id) "
          "VALUES(?,'batch_output',?,?,NULL,'processed',?,?,?)");
      q.bind(st, 1, id);
      q.bind(st, 2, batch_id + (kind == FileKind::output ? "_output.jsonl" : "_error.jsonl"));
      q.bind(st, 3, bytes);
      q.bind(st, 4, t);
      q.bind(st, 5, std::string(kind_name(kind)));
      q.bind(st, 6, batch_id);
      q.run(st);
      return id;
    };
    std::optional<std::string> out = add(FileKind::output, output_bytes), err = add(FileKind::error, error_bytes);
    sqlite3_stmt* st = q.stmt("UPDATE batches SET output_file_id = ?, error_file_id = ? WHERE id = ?");
    q.bind(st, 1, out);
    q.bind(st, 2, err);
    q.bind(st, 3, batch_id);
    q.run(st);
    return true;
  });
}

std::vector<std::string> Queue::batches_in(BatchStatus status) const {
  std::lock_guard lk(impl_->mu);
  Impl& q = *impl_;
  sqlite3_stmt* st = q.stmt("SELECT id FROM batches WHERE status = ? ORDER BY created_at, id");
  q.bind(st, 1, std::string(to_string(status)));
  std::vector<std::string> out;
  while (q.step(st)) out.push_back(Impl::text(st, 0));
  sqlite3_reset(st);
  return out;
}

void Queue::for_each_result(const std::string& batch_id, const std::function<bool(const BatchRow&)>& f) const {
  constexpr int64_t kPage = 256;
  RequestId last = 0;
  std::vector<BatchRow> page;
  for (;;) {
    page.clear();
    {
      std::lock_guard lk(impl_->mu);
      Impl& q = *impl_;
      sqlite3_stmt* st = q.stmt(
          "SELECT r.id, r.custom_id, r.state, s.request_id IS NOT NULL, s.status_code, s.body, s.error "
          "FROM requests r LEFT JOIN results s ON s.request_id = r.id "
          "WHERE r.batch_id = ? AND r.id > ? AND r.state IN ('done','failed','cancelled') ORDER BY r.id LIMIT ?");
      q.bind(st, 1, batch_id);
      q.bind(st, 2, last);
      q.bind(st, 3, kPage);
      while (q.step(st)) {
        BatchRow row;
        row.id = sqlite3_column_int64(st, 0);
        row.custom_id = Impl::text(st, 1);
        row.state = parse_state(Impl::text(st, 2), q.path);
        if (sqlite3_column_int64(st, 3))
          row.result = Result{sqlite3_column_int64(st, 4), Impl::text(st, 5), Impl::text(st, 6)};
        page.push_back(std::move(row));
      }
      sqlite3_reset(st);
    }
    for (const BatchRow& row : page)
      if (!f(row)) return;
    if (static_cast<int64_t>(page.size()) < kPage) return;
    last = page.back().id;
  }
}

}  // namespace corelm::queue
