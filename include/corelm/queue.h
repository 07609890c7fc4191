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
  bool dedup = true;                 // an identical model + body already done reuses its result
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

// The queue file under a state dir.
std::string queue_path(const std::string& state_dir);

// The schema v1 DDL (what corelm wrote before the endpoint column): tests build a v1 file with it
// to check the migration that open() applies in place.
const char* schema_v1_sql();

class Queue {
 public:
  // Opens or creates the queue at `path` (its folder must exist) and migrates its schema to the
  // current version. FormatError naming the file: not a SQLite file, a SQLite file of another
  // application, a schema newer than this build knows, a corrupt file. IOError: cannot open.
  static Queue open(const std::string& path, const QueueOptions& options = {});
  Queue(Queue&&) noexcept;
  Queue& operator=(Queue&&) noexcept;
  ~Queue();

  static constexpr int64_t kSchemaVersion = 2;
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

 private:
  struct Impl;
  explicit Queue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace corelm::queue
