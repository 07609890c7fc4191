// The queue worker of `corelm serve --state-dir`: one thread per server that leases rows from the
// persistent queue as the server has capacity, runs each through the execution core at queued
// priority, and acks the results in batches (one transaction for every result finished since the
// last ack, at least every ack_interval_s). Several servers sharing a state dir each run one; the
// queue's leases keep them from running a row twice. While interactive HTTP requests run or wait,
// queued rows hold at most max(1, batch_share * slots) of a model's slots. A redone row (its first
// worker died) samples with the seed derived from its content, so it reproduces the first run.
// See docs/SERVING.md, "Queue workers".
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "corelm/queue.h"
#include "serve/executor.h"
#include "serve/request.h"

namespace corelm::serve {

struct QueueWorkerOptions {
  std::string worker_id;        // the lease holder's name (default_worker_id() when empty)
  double lease_seconds = 300;   // renewed every lease_seconds / 3
  double batch_share = 0.5;
  int64_t slots = 8;            // per model (the scheduler's)
  ExecOptions exec;             // limits, max_tokens_limit, metrics; seed/id/priority set per row
  double ack_interval_s = 0.02; // results wait at most this long for their batched ack
  double poll_interval_s = 0.02; // an idle worker looks for new rows this often
};

// What the worker needs from its server.
struct QueueWorkerHooks {
  std::function<std::vector<std::string>()> model_ids;
  // The model (loading it when needed); an ApiError: 404 not served (the row gets that error
  // result), 503 not ready yet (the row waits here), else the row is failed (and retried).
  std::function<std::variant<std::shared_ptr<LoadedModel>, ApiError>(const std::string&)> acquire;
  std::function<bool()> interactive_busy;  // an interactive request is running or waiting
  std::function<bool()> ready;             // false: do not lease yet (models still loading)
};

class QueueWorker {
 public:
  // `q` must outlive the worker.
  QueueWorker(queue::Queue& q, QueueWorkerOptions options, QueueWorkerHooks hooks);
  ~QueueWorker();  // finish(now)
  QueueWorker(const QueueWorker&) = delete;
  QueueWorker& operator=(const QueueWorker&) = delete;

  void start();
  // New rows were enqueued: look now instead of at the next poll.
  void wake();
  // Drain, step 1: lease and submit nothing more (rows leased but not started stay leased by this
  // process: a restart reclaims them at once, its pid being gone).
  void stop_leasing();
  // Drain, step 2 (after the schedulers drained): acks every result that came in, then stops.
  // Rows still running stay leased.
  void finish();

  const std::string& worker_id() const;
  uint64_t leased_total() const;
  uint64_t completed_total() const;  // results acked (errors included)

  // "<host>:<pid>:<random hex>".
  static std::string default_worker_id();
  // The seed a row samples with when its body has none: a hash of endpoint, model and body.
  static uint64_t seed_for(const std::string& endpoint, const std::string& model, const std::string& body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace corelm::serve
