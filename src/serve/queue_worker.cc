// The queue worker (queue_worker.h). One thread owns every queue call of the worker (lease, ack,
// fail, renew); the scheduler threads only hand finished results to it through an inbox, so a
// slow SQLite commit never stalls a decode step.
#include "serve/queue_worker.h"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "corelm/error.h"
#include "corelm/hash.h"

namespace corelm::serve {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Results handed from the scheduler threads to the worker thread. Shared with the `done`
// callbacks, so one arriving after the worker is gone writes into a live object.
struct Inbox {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<queue::RequestId, ExecResult>> done;
  bool wake = false;
};

struct InFlight {
  std::shared_ptr<LoadedModel> model;  // held until the result is processed on the worker thread
  std::string model_id;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Rows acked between two malloc_trim(0) calls during a long drain (issue 16): glibc keeps the
// memory that a row's short-lived strings and JSON leave free inside its per-thread arenas
// (16 on this 2-core guest), and returns it to the system only when the top of a heap is free.
// malloc_trim also releases the free pages inside the heaps. The worker trims when it goes idle
// (the rows are drained) and every kTrimEveryRows acks while it is busy; one call takes a few ms.
constexpr uint64_t kTrimEveryRows = 50000;

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

std::string error_message(const json& body) {
  if (body.is_object() && body.contains("error") && body["error"].is_object() && body["error"].contains("message") &&
      body["error"]["message"].is_string())
    return body["error"]["message"].get<std::string>();
  return "request failed";
}

}  // namespace

struct QueueWorker::Impl {
  queue::Queue& q;
  QueueWorkerOptions o;
  QueueWorkerHooks hooks;
  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>();
  std::atomic<bool> leasing{true}, stopping{false};
  std::atomic<uint64_t> leased{0}, completed{0};
  std::thread thread;

  // Worker-thread state.
  std::deque<queue::LeasedRequest> waiting;       // leased, not yet submitted
  std::map<queue::RequestId, InFlight> in_flight;  // submitted to a scheduler
  std::map<std::string, int64_t> per_model;        // in_flight rows per model
  std::vector<std::pair<queue::RequestId, queue::Result>> acks;
  bool ack_failing = false;
  uint64_t acked_since_trim = 0;

  Impl(queue::Queue& queue, QueueWorkerOptions opts, QueueWorkerHooks h) : q(queue), o(std::move(opts)), hooks(std::move(h)) {
    if (o.worker_id.empty()) o.worker_id = default_worker_id();
  }

  int64_t cap(bool interactive) const {
    if (!interactive) return o.slots;
    return std::max<int64_t>(1, static_cast<int64_t>(std::floor(o.batch_share * static_cast<double>(o.slots))));
  }

  void result(queue::RequestId id, int status, const json& body) {
    queue::Result r;
    r.status_code = status;
    r.body = dump(body);
    if (status != 200) r.error = error_message(body);
    acks.emplace_back(id, std::move(r));
  }

  void fail(queue::RequestId id, const std::string& why) {
    try {
      q.fail(id, o.worker_id, why);
    } catch (const queue::LeaseLostError&) {
      // Another worker owns the row now: nothing to do.
    } catch (const std::exception& e) {
      std::fprintf(stderr, "corelm: queue: cannot release request %lld: %s\n", static_cast<long long>(id), e.what());
    }
  }

  void flush() {
    if (acks.empty()) return;
    try {
      q.complete_many(o.worker_id, acks);  // rows whose lease was lost are skipped: dropped silently
      stored();
    } catch (const std::exception& e) {
      store_failed(e);
    }
  }

  // A lease with the pending acks in the same transaction (one commit, one fsync, for both);
  // a plain lease when none is pending. On a failure the acks are kept for the next flush.
  std::vector<queue::LeasedRequest> flush_and_lease(int64_t want) {
    if (acks.empty()) return q.lease(o.worker_id, want);
    try {
      queue::AckAndLease got = q.complete_and_lease(o.worker_id, acks, want);
      stored();
      return std::move(got.leased);
    } catch (const std::exception& e) {
      store_failed(e);
      return {};
    }
  }

  void stored() {
    completed += acks.size();
    acked_since_trim += acks.size();
    acks.clear();
    if (ack_failing) std::fprintf(stderr, "corelm: queue: results are stored again\n");
    ack_failing = false;
  }

  // Disk full or a lock held too long: keep the results and retry at the next flush; no leasing
  // meanwhile, so they cannot pile up.
  void store_failed(const std::exception& e) {
    if (!ack_failing) std::fprintf(stderr, "corelm: queue: cannot store %zu results (will retry): %s\n", acks.size(), e.what());
    ack_failing = true;
  }

  void process(queue::RequestId id, ExecResult r) {
    auto it = in_flight.find(id);
    if (it == in_flight.end()) return;
    --per_model[it->second.model_id];
    in_flight.erase(it);
    const int s = r.status;
    if (s == 200 || (s >= 400 && s < 500 && s != 429)) {
      result(id, s, r.body);  // a deterministic answer: stored, never retried
    } else if (!leasing) {
      // Cancelled by the drain: stays leased by this exiting process (reclaimed at restart).
    } else {
      fail(id, error_message(r.body));
    }
  }

  // Starts the waiting rows that fit their model's share; the others wait for the next round.
  void submit_waiting() {
    if (waiting.empty()) return;
    const bool interactive = hooks.interactive_busy && hooks.interactive_busy();
    // Without interactive traffic a model's scheduler also gets a slots-deep backlog of queued
    // rows (waiting in its queue, not in slots): a sequence that ends is replaced within the
    // same step, even while this thread is inside a commit. With interactive traffic, only the
    // share: no backlog that would take slots after the interactive requests.
    const int64_t c = interactive ? cap(true) : 2 * o.slots;
    const std::vector<std::string> served = hooks.model_ids();
    std::deque<queue::LeasedRequest> later;
    while (!waiting.empty()) {
      queue::LeasedRequest row = std::move(waiting.front());
      waiting.pop_front();
      const auto ep = row.endpoint == "/v1/chat/completions" ? Endpoint::ChatCompletions : Endpoint::Completions;
      if (row.endpoint != "/v1/completions" && row.endpoint != "/v1/chat/completions") {
        result(row.id, 400, api_error(400, "unsupported endpoint '" + row.endpoint + "' (queued rows are for /v1/completions or /v1/chat/completions)", "url", "invalid_url").to_json());
        continue;
      }
      if (std::find(served.begin(), served.end(), row.model) == served.end()) {
        result(row.id, 404, ApiError{404, "The model '" + row.model + "' does not exist", "invalid_request_error", "model", "model_not_found"}.to_json());
        continue;
      }
      if (per_model[row.model] >= c) {
        later.push_back(std::move(row));
        continue;
      }
      auto a = hooks.acquire(row.model);
      if (auto* e = std::get_if<ApiError>(&a)) {
        if (e->status == 404) result(row.id, 404, e->to_json());
        else if (e->status == 503) later.push_back(std::move(row));
        else fail(row.id, e->message);
        continue;
      }
      auto model = std::get<std::shared_ptr<LoadedModel>>(a);
      ExecOptions eo = o.exec;
      eo.priority = infer::SequenceRequest::kQueued;
      eo.default_seed = seed_for(row.endpoint, row.model, row.body);
      eo.response_id = (ep == Endpoint::ChatCompletions ? "chatcmpl-q" : "cmpl-q") + std::to_string(row.id);
      in_flight[row.id] = InFlight{model, row.model};
      ++per_model[row.model];
      auto box = inbox;
      const queue::RequestId id = row.id;
      execute(*model, ep, row.body, {row.model}, eo, [box, id](ExecResult r) {
        std::lock_guard<std::mutex> lock(box->m);
        box->done.emplace_back(id, std::move(r));
        box->cv.notify_all();
      });
    }
    waiting = std::move(later);
  }

  void loop() {
    auto last_renew = Clock::now(), last_flush = Clock::now(), next_lease = Clock::now();
    const auto renew_every = std::chrono::duration<double>(std::max(0.05, o.lease_seconds / 3));
    const auto ack_every = std::chrono::duration<double>(o.ack_interval_s);
    const auto poll = std::chrono::duration<double>(o.poll_interval_s);
    for (;;) {
      std::vector<std::pair<queue::RequestId, ExecResult>> done;
      bool woken = false;
      {
        std::lock_guard<std::mutex> lock(inbox->m);
        done.swap(inbox->done);
        woken = inbox->wake;
        inbox->wake = false;
      }
      for (auto& [id, r] : done) process(id, std::move(r));
      const auto now = Clock::now();
      const bool stop = stopping.load();
      if (!acks.empty() && (stop || now - last_flush >= ack_every || acks.size() >= 256)) {
        flush();
        last_flush = Clock::now();
        if (acked_since_trim >= kTrimEveryRows) {
          release_free_memory();
          acked_since_trim = 0;
        }
      }
      if (stop) {
        // finish(): the schedulers have drained; take what came in since the swap above, ack it,
        // and leave what is still in flight leased.
        {
          std::lock_guard<std::mutex> lock(inbox->m);
          done.clear();
          done.swap(inbox->done);
        }
        for (auto& [id, r] : done) process(id, std::move(r));
        flush();
        return;
      }
      if (now - last_renew >= renew_every && (!in_flight.empty() || !waiting.empty())) {
        try {
          q.renew(o.worker_id);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "corelm: queue: cannot renew leases: %s\n", e.what());
        }
        last_renew = now;
      }
      if (leasing) {
        submit_waiting();
        const bool interactive = hooks.interactive_busy && hooks.interactive_busy();
        // Leased ahead: up to two shares wait here, so a finished row is replaced without a queue
        // round trip; refilled only once one share has gone, so each lease (one transaction, an
        // fsync with --queue-sync full) takes at least a share of rows.
        const int64_t c = interactive ? cap(true) : 2 * o.slots;
        const int64_t want = 3 * c - static_cast<int64_t>(in_flight.size() + waiting.size());
        const bool low = static_cast<int64_t>(waiting.size()) < c;
        if (want > 0 && low && !ack_failing && (woken || now >= next_lease) && (!hooks.ready || hooks.ready())) {
          std::vector<queue::LeasedRequest> rows;
          try {
            if (!acks.empty()) last_flush = Clock::now();
            rows = flush_and_lease(want);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "corelm: queue: cannot lease: %s\n", e.what());
          }
          leased += rows.size();
          if (rows.empty()) {
            next_lease = now + std::chrono::duration_cast<Clock::duration>(poll);
            // Idle (nothing left to run or to ack): give the drain's free memory back.
            if (acked_since_trim > 0 && in_flight.empty() && waiting.empty() && acks.empty()) {
              release_free_memory();
              acked_since_trim = 0;
            }
          } else {
            for (auto& r : rows) waiting.push_back(std::move(r));
            submit_waiting();
            continue;  // maybe more to lease
          }
        }
      }
      std::unique_lock<std::mutex> lock(inbox->m);
      const auto wait = acks.empty() ? poll : std::min(poll, ack_every);
      inbox->cv.wait_for(lock, wait, [&] { return !inbox->done.empty() || inbox->wake || stopping.load(); });
    }
  }
};

QueueWorker::QueueWorker(queue::Queue& q, QueueWorkerOptions options, QueueWorkerHooks hooks)
    : impl_(std::make_unique<Impl>(q, std::move(options), std::move(hooks))) {}

QueueWorker::~QueueWorker() { finish(); }

void QueueWorker::start() {
  if (!impl_->thread.joinable() && !impl_->stopping) impl_->thread = std::thread([this] { impl_->loop(); });
}

void QueueWorker::wake() {
  std::lock_guard<std::mutex> lock(impl_->inbox->m);
  impl_->inbox->wake = true;
  impl_->inbox->cv.notify_all();
}

void QueueWorker::stop_leasing() {
  impl_->leasing = false;
  wake();
}

void QueueWorker::finish() {
  impl_->leasing = false;
  {
    std::lock_guard<std::mutex> lock(impl_->inbox->m);
    impl_->stopping = true;
    impl_->inbox->cv.notify_all();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

const std::string& QueueWorker::worker_id() const { return impl_->o.worker_id; }
uint64_t QueueWorker::leased_total() const { return impl_->leased; }
uint64_t QueueWorker::completed_total() const { return impl_->completed; }

std::string QueueWorker::default_worker_id() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  return std::string(host) + ":" + std::to_string(::getpid()) + ":" + random_hex(8);
}

uint64_t QueueWorker::seed_for(const std::string& endpoint, const std::string& model, const std::string& body) {
  // FNV-1a (corelm/hash.h): stable across builds and machines.
  uint64_t h = kFnv1aOffset;
  auto mix = [&](const std::string& s) {
    h = fnv1a(s, h);
    h = fnv1a(std::string_view("\xff", 1), h);  // field separator: ("ab","c") and ("a","bc") differ
  };
  mix(endpoint);
  mix(model);
  mix(body);
  return h;
}

}  // namespace corelm::serve
