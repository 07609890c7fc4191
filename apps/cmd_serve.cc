// corelm serve: the OpenAI-compatible HTTP server. Parses options, prints one "listening on" line
// once the port is bound, and turns SIGTERM/SIGINT into a drain (a sigwait thread: no work in a
// signal handler). A second signal during the drain exits at once.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "kv_cache_flags.h"
#include "corelm/error.h"
#include "corelm/serve.h"
#include "corelm/thread_pool.h"

namespace corelm::cli {
namespace {

struct ServeArgs {
  serve::ServeOptions o;
  std::string api_key_file, precision = "bf16", queue_sync = "full";
  std::vector<std::string> cache_type_k, cache_type_v;  // TYPE (every model) or ID=TYPE
  int threads = 1;
  bool json = false;
};

std::string read_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open the API key file (--api-key-file)");
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
  CORELM_CHECK(!key.empty(), ValueError, path, ": the API key file is empty (--api-key-file)");
  return key;
}

// --cache-type-k/-v TYPE sets every model's type, ID=TYPE one model's (the other side keeps the
// default); at most one plain TYPE per flag.
void parse_serve_cache_types(const ServeArgs& a, serve::ServeOptions& o) {
  for (int side = 0; side < 2; ++side) {
    const char* flag = side == 0 ? "--cache-type-k" : "--cache-type-v";
    int plain = 0;
    for (const std::string& s : side == 0 ? a.cache_type_k : a.cache_type_v)
      if (s.find('=') == std::string::npos) {
        CORELM_CHECK(++plain == 1, ValueError, flag, " TYPE given twice (use ID=TYPE for one model)");
        const model::KVCacheTypes t = parse_kv_cache_flags(side == 0 ? s : "f32", side == 0 ? "f32" : s);
        (side == 0 ? o.kv_cache_types.k : o.kv_cache_types.v) = side == 0 ? t.k : t.v;
      }
  }
  for (int side = 0; side < 2; ++side)
    for (const std::string& s : side == 0 ? a.cache_type_k : a.cache_type_v) {
      const size_t eq = s.find('=');
      if (eq == std::string::npos) continue;
      const std::string id = s.substr(0, eq), name = s.substr(eq + 1);
      CORELM_CHECK(!id.empty(), ValueError, side == 0 ? "--cache-type-k" : "--cache-type-v", " '", s,
                   "': expected TYPE or MODEL_ID=TYPE");
      auto it = o.kv_cache_types_by_model.try_emplace(id, o.kv_cache_types).first;
      const model::KVCacheTypes t = parse_kv_cache_flags(side == 0 ? name : "f32", side == 0 ? "f32" : name);
      (side == 0 ? it->second.k : it->second.v) = side == 0 ? t.k : t.v;
    }
}

void run(ServeArgs& a) {
  CORELM_CHECK(a.o.api_key.empty() || a.api_key_file.empty(), ValueError, "give at most one of --api-key and --api-key-file");
  if (!a.api_key_file.empty()) a.o.api_key = read_key_file(a.api_key_file);
  CORELM_CHECK(a.threads >= 1 && a.threads <= kMaxThreads, ValueError, "--threads must be in [1, ", kMaxThreads, "] (got ",
               a.threads, ")");
  a.o.precision = model::parse_precision(a.precision);
  parse_serve_cache_types(a, a.o);
  a.o.queue_sync = a.queue_sync == "normal" ? queue::Sync::normal : queue::Sync::full;
  set_num_threads(a.threads);

  // Every thread started from here on inherits the blocked mask, so only the sigwait thread
  // ever receives these signals.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);  // wakes the waiter when serving ends without a signal
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a kill

  serve::Server server(a.o);
  const int port = server.bind();
  if (a.json) {
    std::cout << nlohmann::json({{"event", "listening"}, {"host", a.o.host}, {"port", port},
                                 {"models", server.model_ids()}}).dump()
              << std::endl;
  } else {
    std::cout << "listening on http://" << a.o.host << ":" << port << std::endl;
  }

  bool clean = true;
  std::thread waiter([&] {
    int sig = 0;
    if (sigwait(&set, &sig) != 0 || sig == SIGUSR1) return;
    std::fprintf(stderr, "corelm: %s: draining (up to %.0f s), new requests get 503\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 a.o.drain_seconds);
    std::thread second([&] {
      int s2 = 0;
      if (sigwait(&set, &s2) == 0 && s2 != SIGUSR1) {
        std::fprintf(stderr, "corelm: second signal: exiting without waiting for the drain\n");
        std::_Exit(1);
      }
    });
    clean = server.shutdown();
    pthread_kill(second.native_handle(), SIGUSR1);
    second.join();
  });
  try {
    server.serve();
  } catch (...) {
    pthread_kill(waiter.native_handle(), SIGUSR1);
    waiter.join();
    throw;
  }
  pthread_kill(waiter.native_handle(), SIGUSR1);  // no-op when the waiter already returned... see below
  waiter.join();
  std::fprintf(stderr, "corelm: stopped%s\n", clean ? "" : " (requests still running at the drain deadline were cancelled)");
}

RegisterCommand reg([](CLI::App& root) {
  auto args = std::make_shared<ServeArgs>();
  serve::ServeOptions& o = args->o;
  CLI::App* c = root.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming, constrained "
                                             "decoding) with continuous batching; see docs/SERVING.md");
  c->add_option("--model", o.models, "model to serve (repeatable): a model folder, HF folder or .gguf; its id is the "
                                     "folder / file name without .gguf; loaded at start");
  c->add_option("--models-dir", o.models_dir, "serve every model in this folder (subfolders with config.json, .gguf "
                                              "files), each loaded on first use");
  c->add_option("--max-loaded", o.max_loaded, "models held in memory at once (least recently used idle ones are "
                                              "unloaded)")->capture_default_str();
  c->add_option("--host", o.host, "address to bind (loopback by default)")->capture_default_str();
  c->add_option("--port", o.port, "port to bind; 0 picks a free one (printed on the 'listening on' line)")->capture_default_str();
  c->add_option("--api-key", o.api_key, "require this key (Authorization: Bearer KEY or X-Api-Key: KEY); /health stays public");
  c->add_option("--api-key-file", args->api_key_file, "read the API key from this file (first line)");
  c->add_option("--threads", args->threads, "compute threads, 1 to " + std::to_string(kMaxThreads))->capture_default_str();
  c->add_option("--slots", o.slots, "sequences decoded together per model (KV cache slots); also bounds n")->capture_default_str();
  c->add_option("--max-queue", o.max_queue, "requests waiting for a slot per model; beyond it 429 with Retry-After")
      ->capture_default_str();
  c->add_option("--ctx", o.ctx, "positions per slot (0: the model's context, at most 4096)")->capture_default_str();
  c->add_option("--drain-seconds", o.drain_seconds, "on SIGTERM/SIGINT, time in-flight requests get to finish before "
                                                    "they are cancelled")->capture_default_str();
  c->add_option("--max-body-bytes", o.max_body_bytes, "larger request bodies get 413")->capture_default_str();
  c->add_option("--max-tokens-limit", o.max_tokens_limit, "largest max_tokens a request may ask for (400 above)")
      ->capture_default_str();
  c->add_option("--http-threads", o.http_threads, "connections served at once (0: slots + max-queue + 16)")->capture_default_str();
  c->add_option("--read-timeout", o.read_timeout_s, "seconds a client may stay silent while sending a request (slow "
                                                    "clients are cut)")->capture_default_str();
  c->add_option("--write-timeout", o.write_timeout_s, "seconds a client may stop reading before it is cut and its "
                                                      "request cancelled")->capture_default_str();
  c->add_option("--keep-alive-timeout", o.keep_alive_timeout_s, "seconds an idle keep-alive connection is kept")
      ->capture_default_str();
  c->add_option("--keep-alive-max", o.keep_alive_max, "requests per keep-alive connection")->capture_default_str();
  c->add_option("--precision", args->precision, "bf16 (fast path, default), int8, q4 or f32 (reference)")
      ->check(CLI::IsMember(model::precision_names()))
      ->capture_default_str();
  c->add_option("--cache-type-k", args->cache_type_k,
                std::string("KV cache keys: ") + kKVCacheTypeNames + " for every model (default f32), or "
                    "MODEL_ID=TYPE for one model (repeatable)");
  c->add_option("--cache-type-v", args->cache_type_v,
                std::string("KV cache values: ") + kKVCacheTypeNames + " for every model (default f32), or "
                    "MODEL_ID=TYPE for one model (repeatable)");
  c->add_option("--state-dir", o.state_dir, "persistent queue folder (created if missing): enables /v1/generate, "
                                            "/v1/files and /v1/batches and the queue worker; servers may share one")
      ->group("Persistent queue");
  c->add_option("--lease-seconds", o.lease_seconds, "a hung worker's queued requests go back to the queue after this")
      ->capture_default_str()
      ->group("Persistent queue");
  c->add_option("--max-attempts", o.max_attempts, "leases of one queued request before it gets an error result")
      ->capture_default_str()
      ->group("Persistent queue");
  c->add_option("--batch-share", o.batch_share, "while interactive requests run or wait, queued work holds at most this "
                                                "fraction of a model's slots (at least 1)")
      ->capture_default_str()
      ->group("Persistent queue");
  c->add_option("--max-queued", o.max_queued, "queued + running requests in the state dir; beyond it 429")
      ->capture_default_str()
      ->group("Persistent queue");
  c->add_option("--max-file-bytes", o.max_file_bytes, "largest /v1/files upload (413 beyond)")
      ->capture_default_str()
      ->group("Persistent queue");
  c->add_option("--max-state-bytes", o.max_state_bytes, "cap on the queue file (0: none); beyond it 507")
      ->capture_default_str()
      ->group("Persistent queue");
  c->add_option("--queue-sync", args->queue_sync, "full: every result is fsynced before it is acked; normal: survives "
                                                  "kill -9, a power cut may lose the last results")
      ->check(CLI::IsMember({"full", "normal"}))
      ->capture_default_str()
      ->group("Persistent queue");
  c->add_option("--worker-id", o.worker_id, "this server's name as a queue lease holder (default host:pid:random)")
      ->group("Persistent queue");
  c->add_flag("--json", args->json, "print the listening line as JSON: {\"event\":\"listening\",\"host\",\"port\",\"models\"}");
  c->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
