// `corelm serve`: an OpenAI-compatible HTTP server (cpp-httplib) over the continuous-batching
// scheduler of infer. One Scheduler per loaded model; the server parses and validates requests
// (src/serve/request.h), applies the chat template, tokenizes, submits, and turns the
// scheduler's callbacks into JSON or SSE. Endpoints, limits, errors and metrics: docs/SERVING.md.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "corelm/model.h"
#include "corelm/queue.h"

namespace corelm::serve {

struct ServeOptions {
  std::vector<std::string> models;  // --model: loaded at start (in the background), never unloaded
  std::string models_dir;           // --models-dir: every model inside, loaded on first use
  int64_t max_loaded = 4;           // models held at once (LRU; only idle models are unloaded)
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (Server::bind returns it)
  std::string api_key;              // empty: no authentication
  int64_t slots = 8;                // scheduler slots per model (sequences decoded together)
  int64_t max_queue = 64;           // requests waiting per model; beyond it 429
  int64_t ctx = 0;                  // positions per slot; 0: the model's context (capped at 4096)
  double drain_seconds = 30;        // SIGTERM: time in-flight requests get before being cancelled
  int64_t max_body_bytes = 4 << 20; // larger request bodies: 413
  int64_t max_tokens_limit = 4096;  // max_tokens above it: 400
  int64_t http_threads = 0;         // connections served at once; 0: slots + max_queue + 16
  double read_timeout_s = 10;       // a client silent this long while sending a request is cut
  double write_timeout_s = 30;      // a client not reading this long is cut (and its request cancelled)
  double keep_alive_timeout_s = 5;  // idle keep-alive connections are closed after this
  int64_t keep_alive_max = 100;     // requests per keep-alive connection
  model::Precision precision = model::Precision::BF16;
  // KV cache types of every served model (--cache-type-k/--cache-type-v TYPE), and per model id
  // (--cache-type-k ID=TYPE) where one model needs another; each model is checked at its load.
  model::KVCacheTypes kv_cache_types;
  std::map<std::string, model::KVCacheTypes> kv_cache_types_by_model;
  model::KVCacheTypes kv_cache_types_for(const std::string& model_id) const;

  // Persistent queue (issue 16). Empty state_dir: no queue; /v1/files, /v1/batches and
  // /v1/generate answer 404 with a message naming --state-dir. Several servers may share one
  // state dir (one SQLite file, queue::queue_path(state_dir)); each pulls work as it has slots.
  std::string state_dir;
  double lease_seconds = 300;       // --lease-seconds: a hung worker's requests go back after this
  int64_t max_attempts = 3;         // --max-attempts: leases of one request before its error result
  // --batch-share: while interactive requests are running or waiting, queued work holds at most
  // this fraction of a model's slots (at least 1); with no interactive traffic it may use all.
  double batch_share = 0.5;
  int64_t max_queued = 1'000'000;   // --max-queued: queued + running rows; beyond it 429
  int64_t max_file_bytes = 200 << 20;  // --max-file-bytes: largest /v1/files upload (413 beyond)
  int64_t max_state_bytes = 0;      // --max-state-bytes: cap on the queue file (0: none); beyond it 507
  queue::Sync queue_sync = queue::Sync::full;  // --queue-sync full|normal
  std::string worker_id;            // empty: "<host>:<pid>:<random>"
  void validate() const;            // ValueError naming the option
};

class Server {
 public:
  // Validates the options and lists the models (IOError / ValueError for a missing path, a
  // models-dir without models, or two models with the same id). Loads nothing yet.
  explicit Server(ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (IOError when it cannot); returns the port (the real one for port 0).
  int bind();
  // Loads the --model models in the background (/health answers 503 until they are ready) and
  // serves until shutdown(); returns once the listener has stopped.
  void serve();
  // Thread-safe (not from a signal handler): new requests get 503, every scheduler drains for
  // up to drain_seconds (then cancels), the listener stops. Returns true when nothing had to be
  // cancelled.
  bool shutdown();

  bool ready() const;                       // every --model model loaded
  std::vector<std::string> model_ids() const;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The id a model path is served under: the folder or file name, without ".gguf".
std::string model_id_for_path(const std::string& path);

}  // namespace corelm::serve
