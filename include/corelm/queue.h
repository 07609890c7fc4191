// The persistent request queue: one SQLite file (WAL mode) that `corelm serve` processes and
// `corelm run` share. One row per prompt moves queued -> running -> done | failed (or cancelled);
// a worker takes rows with a lease (worker id, pid, host, expiry) and acks each row on its own, so
// a crash loses at most the rows in flight and those go back to queued: at once when the
// holder's process is gone on this host, after lease_seconds when it hangs. Every write is one
// transaction and a result is on disk when complete() returns (synchronous=FULL by default).
// No HTTP here: the server maps these calls and errors to the Files/Batches API.
// See docs/SERVING.md, "Persistent queue (library)".
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "corelm/error.h"

namespace corelm::queue {

// enqueue() when max_requests rows are already queued or running (the server answers 429).
class QueueFullError : public Error {
 public:
  using Error::Error;
};
// A write that does not fit: the file reached max_db_bytes or the disk is full (the server
// answers 507). The transaction is rolled back whole; what was stored before stays readable.
class StorageFullError : public IOError {
 public:
  using IOError::IOError;
};
// complete()/fail() by a worker that no longer holds the request's lease (it expired and the
// request was reclaimed, maybe leased by another worker): its result is refused, not stored.
class LeaseLostError : public Error {
 public:
  using Error::Error;
};

enum class RequestState { queued, running, done, failed, cancelled };
const char* to_string(RequestState s);

// How a commit reaches the disk. full: the WAL is fsynced at every commit, so a result survives
// power loss once complete() returns. normal: no fsync at commit (WAL mode still survives a
// process crash or kill -9 with every committed row; a power cut may lose the last commits).
enum class Sync { full, normal };

struct QueueOptions {
  int64_t max_requests = 1'000'000;  // bound on queued + running rows; enqueue beyond -> QueueFullError
  double lease_seconds = 300;        // a lease not renewed for this long is reclaimed
  int64_t max_attempts = 3;          // leases of one request before it fails with an error result
  int64_t busy_timeout_ms = 10'000;  // wait this long for another process's write lock
  Sync sync = Sync::full;
  // An identical model + body + endpoint already done reuses its result. Off: no lookup, and the
  // rows this queue enqueues are no dedup source for anyone (schema v4: no index entry at ack).
  bool dedup = true;
  int64_t max_db_bytes = 0;          // cap on the database file (0: none); beyond -> StorageFullError
};

using RequestId = int64_t;

struct Result {
  int64_t status_code = 200;
  std::string body;   // the response body (JSON text) on success
  std::string error;  // empty on success
};

// The endpoint a queued body is for ("/v1/completions" or "/v1/chat/completions"); part of the
// content hash, so the same body sent to two endpoints is two requests.
inline constexpr const char* kDefaultEndpoint = "/v1/completions";

struct NewRequest {
  std::string model;
  std::string body;  // JSON text
  std::optional<std::string> batch_id = std::nullopt;
  std::optional<std::string> custom_id = std::nullopt;  // unique within its batch
  std::string endpoint = kDefaultEndpoint;
};

struct LeasedRequest {
  RequestId id = 0;
  std::string model;
  std::string body;
  std::optional<std::string> batch_id;
  std::optional<std::string> custom_id;
  int64_t attempts = 0;  // including this lease
  std::string endpoint = kDefaultEndpoint;
};

struct RequestInfo {
  RequestId id = 0;
  RequestState state = RequestState::queued;
  int64_t attempts = 0;
  std::string model;
  std::optional<std::string> batch_id;
  std::optional<std::string> custom_id;
  std::string worker_id;          // the lease holder while running
  std::optional<Result> result;   // present when done or failed
  std::string endpoint = kDefaultEndpoint;
};

struct Counts {
  int64_t queued = 0, running = 0, done = 0, failed = 0, cancelled = 0;
  int64_t total() const { return queued + running + done + failed + cancelled; }
};

// ---- Files and batches (the OpenAI Files/Batches API's state; HTTP lives in src/serve) --------

// An unknown file or batch id (the server answers 404).
class NotFoundError : public Error {
 public:
  using Error::Error;
};

enum class FileKind { upload, output, error };  // output / error: rendered from a batch's results
struct FileInfo {
  std::string id;        // "file-<24 hex>"
  std::string purpose;   // "batch" (uploads) or "batch_output"
  std::string filename;
  int64_t bytes = 0;
  double created_at = 0;
  FileKind kind = FileKind::upload;
  std::optional<std::string> batch_id;  // output / error files: their batch
};

enum class BatchStatus { validating, failed, in_progress, finalizing, completed, expired, cancelling, cancelled };
const char* to_string(BatchStatus s);
bool is_terminal(BatchStatus s);  // failed, completed, expired, cancelled

struct BatchCounts {
  int64_t total = 0;
  int64_t completed = 0;  // done with status 200
  int64_t failed = 0;     // failed, done with another status, or cancelled / expired unrun
};

struct BatchInfo {
  std::string id;  // "batch_<24 hex>"
  std::string input_file_id, endpoint, completion_window;
  std::string metadata;  // JSON text ("" -> null)
  std::string errors;    // JSON text ("" -> null)
  BatchStatus status = BatchStatus::validating;
  std::optional<std::string> output_file_id, error_file_id;
  double created_at = 0;
  std::optional<double> in_progress_at, expires_at, finalizing_at, completed_at, failed_at, expired_at,
      cancelling_at, cancelled_at;
  BatchCounts counts;
};

// One request row of a batch with its result, as for_each_result() streams them.
struct BatchRow {
  RequestId id = 0;
  std::string custom_id;
  RequestState state = RequestState::queued;
  std::optional<Result> result;
};

// The queue file under a state dir.
std::string queue_path(const std::string& state_dir);

// The schema v1 DDL (what corelm wrote before the endpoint column): tests build a v1 file with it
// to check the migration that open() applies in place.
const char* schema_v1_sql();
// The DDL that takes a file from version - 1 to `version` (2, 3 or 4; nullptr otherwise): with
// schema_v1_sql(), tests build a file of any older version exactly as that corelm left it.
const char* schema_migration_sql(int64_t version);

// What complete_and_lease() did: the acks it refused (lease lost, as complete_many) and the rows
// it leased.
struct AckAndLease {
  std::vector<RequestId> refused;
  std::vector<LeasedRequest> leased;
};

class Queue {
 public:
  // Opens or creates the queue at `path` (its folder must exist) and migrates its schema to the
  // current version. FormatError naming the file: not a SQLite file, a SQLite file of another
  // application, a schema newer than this build knows, a corrupt file. IOError: cannot open.
  static Queue open(const std::string& path, const QueueOptions& options = {});
  Queue(Queue&&) noexcept;
  Queue& operator=(Queue&&) noexcept;
  ~Queue();

  static constexpr int64_t kSchemaVersion = 4;
  int64_t schema_version() const;
  const std::string& path() const;

  // ValueError: empty model, body not JSON, duplicate custom_id in the batch.
  RequestId enqueue(const std::string& model, const std::string& body_json,
                    const std::optional<std::string>& batch_id = std::nullopt,
                    const std::optional<std::string>& custom_id = std::nullopt,
                    const std::string& endpoint = kDefaultEndpoint);
  // All or nothing, in one transaction (QueueFullError when they do not all fit).
  std::vector<RequestId> enqueue_many(const std::vector<NewRequest>& requests);

  // Up to n queued requests, oldest first, leased to worker_id (this process's pid and host are
  // recorded). Reclaims expired and dead-process leases first.
  std::vector<LeasedRequest> lease(const std::string& worker_id, int64_t n);
  // Stores the result and marks the request done, in one transaction; LeaseLostError when
  // worker_id does not hold the request's lease.
  void complete(RequestId id, const std::string& worker_id, const Result& result);
  // complete() for several requests in one transaction (one fsync: a scheduler step that ends
  // several sequences acks them together). Requests whose lease worker_id no longer holds are
  // skipped and returned; the others are stored.
  std::vector<RequestId> complete_many(const std::string& worker_id,
                                       const std::vector<std::pair<RequestId, Result>>& results);
  // complete_many(results) and then lease(worker_id, n) in one transaction: a worker that acks a
  // group and refills pays one commit (one fsync under Sync::full) for both. The results are on
  // disk when it returns, as with complete_many; a crash before the commit keeps neither the
  // results nor the new leases (those rows stay queued). n == 0 leases nothing; results may be
  // empty. ValueError as lease() for an empty worker_id or n < 0.
  AckAndLease complete_and_lease(const std::string& worker_id,
                                 const std::vector<std::pair<RequestId, Result>>& results, int64_t n);
  // Back to queued, or failed with an error result once attempts >= max_attempts.
  // Returns the new state. LeaseLostError as complete().
  RequestState fail(RequestId id, const std::string& worker_id, const std::string& error);
  // Extends every lease worker_id holds by lease_seconds; returns how many.
  int64_t renew(const std::string& worker_id);
  // Expired leases and leases of processes gone on this host back to queued (or failed when out
  // of attempts); returns how many were reclaimed.
  int64_t reclaim();

  std::optional<RequestInfo> get(RequestId id) const;
  Counts counts() const;
  Counts counts(const std::string& batch_id) const;
  // Queued requests of the batch become cancelled (running ones finish); returns how many.
  int64_t cancel_batch(const std::string& batch_id);

  // ---- Files ----
  // An uploaded file (content stored in the queue file). StorageFullError when it does not fit.
  FileInfo add_file(const std::string& purpose, const std::string& filename, const std::string& content);
  std::optional<FileInfo> get_file(const std::string& id) const;
  // An upload's content; nullopt for an unknown id or an output / error file (those are rendered
  // from for_each_result by the caller).
  std::optional<std::string> file_content(const std::string& id) const;
  // Removes the file; false when unknown. Deleting the last remaining output / error file of a
  // batch also deletes that batch's requests and results (the stored work is then gone).
  bool delete_file(const std::string& id);
  // Newest first; `after`: a file id, list those older than it (OpenAI's cursor); limit 1..100000.
  std::vector<FileInfo> list_files(const std::optional<std::string>& after = std::nullopt, int64_t limit = 10000) const;

  // ---- Batches ----
  // A batch in status validating. ValueError: bad endpoint or completion_window ("<N>h", 1 <= N
  // <= 8760), metadata not a JSON object or null; NotFoundError: no such upload; ValueError when
  // the file's purpose is not "batch".
  BatchInfo create_batch(const std::string& input_file_id, const std::string& endpoint,
                         const std::string& completion_window, const std::string& metadata_json = "");
  // with_counts false: counts left zero for a batch still running (they cost a scan of its rows;
  // the monitor polls without them).
  std::optional<BatchInfo> get_batch(const std::string& id, bool with_counts = true) const;
  // Rows of the batch still queued or running (an index range: cheap while the batch drains).
  int64_t pending_in_batch(const std::string& batch_id) const;
  // Newest first, `after` as list_files; limit 1..1000.
  std::vector<BatchInfo> list_batches(const std::optional<std::string>& after = std::nullopt, int64_t limit = 20) const;
  // Enqueues every request (batch_id set to the batch) and moves validating -> in_progress, in
  // one transaction. false (nothing enqueued) when the batch is no longer validating: another
  // process started, failed or cancelled it first. QueueFullError as enqueue_many.
  bool start_batch(const std::string& batch_id, std::vector<NewRequest> requests);
  // validating | in_progress -> failed with `errors_json` ({"object":"list","data":[...]}).
  bool fail_batch(const std::string& batch_id, const std::string& errors_json);
  // `from` -> `to` as one conditional UPDATE that also sets to's *_at; false when the batch was
  // not in `from` (another process moved it first) or is unknown.
  bool transition_batch(const std::string& batch_id, BatchStatus from, BatchStatus to);
  // `from` -> `to` (completed, cancelled or expired) creating the output file (when
  // output_bytes >= 0) and the error file (when error_bytes >= 0) in the same transaction.
  bool finish_batch(const std::string& batch_id, BatchStatus from, BatchStatus to, int64_t output_bytes,
                    int64_t error_bytes);
  // Batches in one status, oldest first (the monitor's work list).
  std::vector<std::string> batches_in(BatchStatus status) const;
  // The batch's done, failed and cancelled rows in id order, fetched in pages (memory does not
  // grow with the batch; the queue is not locked while `f` runs). `f` returns false to stop.
  void for_each_result(const std::string& batch_id, const std::function<bool(const BatchRow&)>& f) const;

 private:
  struct Impl;
  explicit Queue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace corelm::queue
