// The HTTP side of `corelm serve`: routing, authentication, the model registry (startup models,
// lazily loaded --models-dir models under an LRU bound), request execution through the
// scheduler, OpenAI response and SSE chunk shapes, metrics and drain.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "corelm/constraint.h"
#include "corelm/error.h"
#include "corelm/model_loader.h"
#include "corelm/scheduler.h"
#include "corelm/serve.h"
#include "corelm/utf8.h"
#include "serve/batch_api.h"
#include "serve/executor.h"
#include "serve/metrics.h"
#include "serve/queue_worker.h"
#include "serve/request.h"

namespace corelm::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

model::KVCacheTypes ServeOptions::kv_cache_types_for(const std::string& model_id) const {
  auto it = kv_cache_types_by_model.find(model_id);
  return it == kv_cache_types_by_model.end() ? kv_cache_types : it->second;
}

void ServeOptions::validate() const {
  CORELM_CHECK(!models.empty() || !models_dir.empty(), ValueError, "give at least one --model or a --models-dir");
  CORELM_CHECK(max_loaded >= 1, ValueError, "--max-loaded must be >= 1 (got ", max_loaded, ")");
  CORELM_CHECK(port >= 0 && port <= 65535, ValueError, "--port must be in [0, 65535] (got ", port, ")");
  CORELM_CHECK(slots >= 1 && slots <= 1024, ValueError, "--slots must be in [1, 1024] (got ", slots, ")");
  CORELM_CHECK(max_queue >= 0 && max_queue <= 1000000, ValueError, "--max-queue must be in [0, 1000000] (got ", max_queue, ")");
  CORELM_CHECK(ctx >= 0, ValueError, "--ctx must be >= 0 (got ", ctx, ")");
  CORELM_CHECK(drain_seconds >= 0 && drain_seconds <= 86400, ValueError, "--drain-seconds must be in [0, 86400] (got ",
               drain_seconds, ")");
  CORELM_CHECK(max_body_bytes >= 1024, ValueError, "--max-body-bytes must be >= 1024 (got ", max_body_bytes, ")");
  CORELM_CHECK(max_tokens_limit >= 1, ValueError, "--max-tokens-limit must be >= 1 (got ", max_tokens_limit, ")");
  CORELM_CHECK(http_threads >= 0 && http_threads <= 4096, ValueError, "--http-threads must be in [0, 4096] (got ",
               http_threads, ")");
  CORELM_CHECK(read_timeout_s > 0 && write_timeout_s > 0 && keep_alive_timeout_s > 0, ValueError,
               "--read-timeout, --write-timeout and --keep-alive-timeout must be > 0");
  CORELM_CHECK(keep_alive_max >= 1, ValueError, "--keep-alive-max must be >= 1 (got ", keep_alive_max, ")");
  CORELM_CHECK(api_key.find_first_of("\r\n") == std::string::npos, ValueError, "the API key must be one line");
  CORELM_CHECK(lease_seconds >= 0.1 && lease_seconds <= 7 * 86400, ValueError,
               "--lease-seconds must be in [0.1, 604800] (got ", lease_seconds, ")");
  CORELM_CHECK(max_attempts >= 1 && max_attempts <= 1000, ValueError, "--max-attempts must be in [1, 1000] (got ", max_attempts, ")");
  CORELM_CHECK(batch_share > 0 && batch_share <= 1, ValueError, "--batch-share must be in (0, 1] (got ", batch_share, ")");
  CORELM_CHECK(max_queued >= 1, ValueError, "--max-queued must be >= 1 (got ", max_queued, ")");
  CORELM_CHECK(max_file_bytes >= 1, ValueError, "--max-file-bytes must be >= 1 (got ", max_file_bytes, ")");
  CORELM_CHECK(max_state_bytes >= 0, ValueError, "--max-state-bytes must be >= 0 (0: no cap; got ", max_state_bytes, ")");
  for (unsigned char c : worker_id)
    CORELM_CHECK(c >= 0x20 && c != 0x7f, ValueError, "--worker-id must be printable text without control characters");
}

std::string model_id_for_path(const std::string& path) {
  fs::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  std::string name = p.filename().string();
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

namespace {

// httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when Debian built
// the library): a burst of clients connecting at once overflows it and gets resets. listen()
// on the already listening socket raises the backlog, so this subclass exposes the socket.
class HttpServer : public httplib::Server {
 public:
  void raise_backlog(int backlog) {
    const socket_t s = svr_sock_;
    if (s != INVALID_SOCKET) ::listen(s, backlog);
  }
};

// ---------------------------------------------------------------------------------------------
// Models

struct ModelEntry {
  std::string id, path;
  bool pinned = false;  // --model: loaded at start, never unloaded
  enum class State { Unloaded, Loading, Ready, Failed } state = State::Unloaded;
  std::string error;
  std::shared_ptr<LoadedModel> loaded;
  Clock::time_point last_used{};
};

bool is_model_path(const fs::path& p) {
  std::error_code ec;
  if (fs::is_directory(p, ec)) return fs::exists(p / "config.json", ec);
  return fs::is_regular_file(p, ec) && p.extension() == ".gguf";
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Byte-for-byte compare whose time depends only on the lengths, not on where they differ.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string token_text(const Tokenizer& tok, TokenId id) {
  if (id < 0 || static_cast<size_t>(id) >= tok.vocab_size()) return "";
  std::string s(tok.token_bytes(id));
  return s;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Server::Impl {
  ServeOptions o;
  HttpServer http;
  Metrics metrics;
  int bound_port = -1;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};  // HTTP generation requests in flight (streams until released)
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();

  mutable std::mutex models_m;
  std::condition_variable models_cv;
  std::vector<std::string> ids;  // sorted
  std::map<std::string, ModelEntry> models;
  std::thread loader;
  // Declared after the models: destroyed first.
  std::unique_ptr<queue::Queue> queue;  // --state-dir
  std::unique_ptr<QueueWorker> worker;
  std::unique_ptr<BatchApi> batches;  // holds queue.get(): declared after it, destroyed before

  explicit Impl(ServeOptions opts) : o(std::move(opts)) {
    o.validate();
    auto add = [&](const std::string& path, bool pinned) {
      ModelEntry e;
      e.id = model_id_for_path(path);
      e.path = path;
      e.pinned = pinned;
      // Loading from the start: a request racing the loader thread gets 503, never a second load.
      if (pinned) e.state = ModelEntry::State::Loading;
      CORELM_CHECK(!e.id.empty(), ValueError, "cannot name a model after the path '", path, "'");
      CORELM_CHECK(!models.count(e.id), ValueError, "two models would be served as '", e.id, "' (", models[e.id].path,
                   " and ", path, "): rename one");
      models[e.id] = std::move(e);
    };
    for (const auto& p : o.models) {
      std::error_code ec;
      CORELM_CHECK(fs::exists(p, ec), IOError, p, ": no such model file or folder");
      add(p, true);
    }
    if (!o.models_dir.empty()) {
      std::error_code ec;
      CORELM_CHECK(fs::is_directory(o.models_dir, ec), IOError, o.models_dir, ": not a folder (--models-dir)");
      std::vector<fs::path> found;
      for (const auto& d : fs::directory_iterator(o.models_dir, ec))
        if (is_model_path(d.path())) found.push_back(d.path());
      std::sort(found.begin(), found.end());
      CORELM_CHECK(!found.empty(), ValueError, o.models_dir,
                   ": no models inside (a model is a folder with config.json or a .gguf file)");
      for (const auto& p : found) add(p.string(), false);
    }
    for (const auto& [id, e] : models) ids.push_back(id);
    if (!o.state_dir.empty()) open_queue();
  }

  ~Impl() {
    if (batches) batches->stop();
    if (worker) worker->finish();
    if (loader.joinable()) loader.join();
  }

  void open_queue() {
    std::error_code ec;
    fs::create_directories(o.state_dir, ec);
    CORELM_CHECK(fs::is_directory(o.state_dir, ec), IOError, o.state_dir, ": cannot create the state folder (--state-dir)");
    queue::QueueOptions qo;
    qo.max_requests = o.max_queued;
    qo.lease_seconds = o.lease_seconds;
    qo.max_attempts = o.max_attempts;
    qo.sync = o.queue_sync;
    qo.max_db_bytes = o.max_state_bytes;
    // A corrupt or foreign file throws FormatError naming it: the server does not start.
    queue = std::make_unique<queue::Queue>(queue::Queue::open(queue::queue_path(o.state_dir), qo));
    QueueWorkerOptions wo;
    wo.worker_id = o.worker_id;
    wo.lease_seconds = o.lease_seconds;
    wo.batch_share = o.batch_share;
    wo.slots = o.slots;
    wo.exec.limits = limits();
    wo.exec.max_tokens_limit = o.max_tokens_limit;
    wo.exec.metrics = &metrics;
    QueueWorkerHooks h;
    h.model_ids = [this] { return ids; };
    h.acquire = [this](const std::string& id) { return acquire(id); };
    h.interactive_busy = [this] { return active.load() > 0; };
    h.ready = [this] { return ready(); };
    worker = std::make_unique<QueueWorker>(*queue, std::move(wo), std::move(h));
    BatchApiContext bc;
    bc.queue = queue.get();
    bc.model_ids = [this] { return ids; };
    bc.limits = limits();
    bc.max_file_bytes = o.max_file_bytes;
    batches = std::make_unique<BatchApi>(std::move(bc));
  }

  bool ready() const {
    std::lock_guard<std::mutex> lock(models_m);
    for (const auto& [id, e] : models)
      if (e.pinned && e.state != ModelEntry::State::Ready) return false;
    return true;
  }

  void load_pinned() {
    for (const auto& p : o.models) {
      const std::string id = model_id_for_path(p);
      std::shared_ptr<LoadedModel> l;
      std::string err;
      try {
        l = load_model_for_serving(p, o);
      } catch (const std::exception& e) {
        err = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(models_m);
        auto& e = models[id];
        if (l) {
          e.loaded = std::move(l);
          e.state = ModelEntry::State::Ready;
          e.last_used = Clock::now();
        } else {
          e.state = ModelEntry::State::Failed;
          e.error = err;
          std::fprintf(stderr, "corelm: error: model '%s' failed to load: %s\n", id.c_str(), err.c_str());
        }
      }
      models_cv.notify_all();
    }
    if (ready()) {
      std::fprintf(stderr, "corelm: ready (%zu model%s)\n", o.models.size(), o.models.size() == 1 ? "" : "s");
      std::fflush(stderr);
    }
  }

  // The model, loading it first when it is a --models-dir model not loaded yet.
  std::variant<std::shared_ptr<LoadedModel>, ApiError> acquire(const std::string& id) {
    std::unique_lock<std::mutex> lock(models_m);
    auto it = models.find(id);
    if (it == models.end()) return ApiError{404, "The model '" + id + "' does not exist", "invalid_request_error", "model", "model_not_found"};
    ModelEntry& e = it->second;
    // A request that has just been answered may hold its model a moment longer (its handler
    // returning, its scheduler retiring it): "every model is busy" only after this long.
    const auto busy_deadline = Clock::now() + std::chrono::seconds(1);
    for (;;) {
      if (e.state == ModelEntry::State::Ready) {
        e.last_used = Clock::now();
        return e.loaded;
      }
      if (e.state == ModelEntry::State::Failed)
        return ApiError{500, "model '" + id + "' failed to load: " + e.error, "server_error", "model", "model_load_failed"};
      if (e.state == ModelEntry::State::Loading) {
        if (e.pinned) return ApiError{503, "model '" + id + "' is loading; retry shortly", "server_error", "", "model_loading"};
        models_cv.wait_for(lock, std::chrono::milliseconds(200));
        continue;
      }
      // Unloaded: this thread loads it, within the LRU bound: the least recently used idle model
      // (no request holds it) is unloaded first.
      int64_t loaded_count = 0;
      for (const auto& [k, m] : models)
        if (m.state == ModelEntry::State::Ready || m.state == ModelEntry::State::Loading) ++loaded_count;
      if (loaded_count < o.max_loaded) break;
      ModelEntry* victim = nullptr;
      for (auto& [k, m] : models) {
        if (m.pinned || m.state != ModelEntry::State::Ready || m.loaded.use_count() != 1) continue;
        const auto st = m.loaded->scheduler->stats();
        if (st.queued || st.running) continue;
        if (!victim || m.last_used < victim->last_used) victim = &m;
      }
      if (!victim) {
        if (Clock::now() >= busy_deadline)
          return ApiError{503, "every loaded model is busy (--max-loaded " + std::to_string(o.max_loaded) +
                                   "); retry shortly", "server_error", "", "model_capacity"};
        models_cv.wait_for(lock, std::chrono::milliseconds(10));
        continue;  // the states may have changed meanwhile: check again from the top
      }
      std::shared_ptr<LoadedModel> drop = std::move(victim->loaded);
      victim->state = ModelEntry::State::Unloaded;
      std::fprintf(stderr, "corelm: unloaded model '%s' (least recently used)\n", victim->id.c_str());
      lock.unlock();
      drop.reset();  // joins its scheduler outside the lock
      lock.lock();
    }
    e.state = ModelEntry::State::Loading;
    const std::string path = e.path;
    lock.unlock();
    std::shared_ptr<LoadedModel> l;
    std::string err;
    try {
      l = load_model_for_serving(path, o);
    } catch (const std::exception& ex) {
      err = ex.what();
    }
    lock.lock();
    if (l) {
      e.loaded = l;
      e.state = ModelEntry::State::Ready;
      e.last_used = Clock::now();
      std::fprintf(stderr, "corelm: loaded model '%s'\n", id.c_str());
    } else {
      e.state = ModelEntry::State::Failed;
      e.error = err;
    }
    models_cv.notify_all();
    if (!l) return ApiError{500, "model '" + id + "' failed to load: " + err, "server_error", "model", "model_load_failed"};
    return l;
  }

  std::vector<std::pair<std::string, std::shared_ptr<LoadedModel>>> loaded_models() const {
    std::lock_guard<std::mutex> lock(models_m);
    std::vector<std::pair<std::string, std::shared_ptr<LoadedModel>>> out;
    for (const auto& [id, e] : models)
      if (e.state == ModelEntry::State::Ready && e.loaded) out.emplace_back(id, e.loaded);
    return out;
  }

  // -------------------------------------------------------------------------------------------
  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    if (e.status == 503) res.set_header("Retry-After", "1");
    res.set_content(dump(e.to_json()), "application/json");
  }

  RequestLimits limits() const {
    RequestLimits l;
    l.max_n = static_cast<int>(std::min<int64_t>(16, o.slots));
    l.max_tokens_limit = o.max_tokens_limit;
    return l;
  }

  std::string endpoint_label(const std::string& path) const {
    static const char* known[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
                                  "/health", "/metrics", "/slots", "/v1/generate", "/v1/generate/get_results", "/v1/files",
                                  "/v1/batches", "/v1/score"};
    for (const char* k : known)
      if (path == k) return k;
    return "other";
  }

  // -------------------------------------------------------------------------------------------
  void setup_routes() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (!o.api_key.empty()) {
        std::string key;
        const std::string auth = req.get_header_value("Authorization");
        if (auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0)) key = auth.substr(7);
        else key = req.get_header_value("X-Api-Key");
        if (!constant_time_equal(key, o.api_key)) {
          res.set_header("WWW-Authenticate", "Bearer");
          send_error(res, api_error(401, key.empty() ? "missing API key (send Authorization: Bearer KEY or X-Api-Key: KEY)"
                                                     : "invalid API key", "", "invalid_api_key"));
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (draining && req.path != "/metrics") {
        send_error(res, api_error(503, "the server is shutting down", "", "draining"));
        return httplib::Server::HandlerResponse::Handled;
      }
      // With a state dir the transport accepts uploads up to --max-file-bytes; every other
      // endpoint keeps --max-body-bytes (checked here, before the body is read).
      if (batches && req.path.rfind("/v1/files", 0) != 0 && req.has_header("Content-Length")) {
        const std::string len = req.get_header_value("Content-Length");
        const bool digits = !len.empty() && len.size() < 19 && len.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || std::stoll(len) > o.max_body_bytes) {
          send_error(res, api_error(413, "the request body is larger than the limit (" + std::to_string(o.max_body_bytes) +
                                             " bytes, --max-body-bytes)"));
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty() || res.is_chunked_content_provider_) return;
      std::string msg = "request failed";
      if (res.status == 404) msg = "no such endpoint: " + escape_invalid_utf8(req.method + " " + req.path);
      if (res.status == 413) msg = "the request body is larger than the limit (" + std::to_string(o.max_body_bytes) + " bytes, --max-body-bytes)";
      if (res.status == 405) msg = "method not allowed";
      if (res.status == 400) msg = "malformed HTTP request";
      send_error(res, api_error(res.status, msg, "", res.status == 404 ? "not_found" : ""));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = std::string("internal error: ") + e.what();
      } catch (...) {
      }
      send_error(res, api_error(500, what));
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics.count_request(endpoint_label(req.path), res.status);
    });

    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (draining) {
        res.status = 503;
        res.set_content(R"({"status":"draining"})", "application/json");
      } else if (!ready()) {
        res.status = 503;
        json j = {{"status", "loading"}};
        {
          std::lock_guard<std::mutex> lock(models_m);
          for (const auto& [id, e] : models)
            if (e.pinned && e.state == ModelEntry::State::Failed) j = {{"status", "error"}, {"error", e.error}};
        }
        res.set_content(dump(j), "application/json");
      } else {
        res.set_content(R"({"status":"ok"})", "application/json");
      }
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json data = json::array();
      std::lock_guard<std::mutex> lock(models_m);
      for (const auto& id : ids) {
        const auto& e = models.at(id);
        const char* state = e.state == ModelEntry::State::Ready     ? "loaded"
                            : e.state == ModelEntry::State::Loading ? "loading"
                            : e.state == ModelEntry::State::Failed  ? "failed"
                                                                     : "unloaded";
        data.push_back({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "corelm"}, {"status", state}});
      }
      res.set_content(dump({{"object", "list"}, {"data", data}}), "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      Metrics::Gauges g;
      for (const auto& [id, l] : loaded_models()) {
        const auto s = l->scheduler->stats();
        g.queued += s.queued;
        g.running += s.running;
        g.slots += s.slots;
        g.slots_busy += s.slots_busy;
        g.kv_used += s.kv_tokens_used;
        g.kv_capacity += s.kv_tokens_capacity;
        g.prefix_hit_tokens += s.prefix_cache_hit_tokens;
        g.cancelled += s.requests_cancelled;
        ++g.loaded_models;
      }
      std::string text = metrics.render(g);
      if (worker) text += queue_metrics();
      res.set_content(text, "text/plain; version=0.0.4");
    });
    http.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
      json out = json::array();
      for (const auto& [id, l] : loaded_models())
        for (const auto& s : l->scheduler->slots())
          out.push_back({{"model", id}, {"id", s.slot}, {"state", s.state}, {"request", s.request}, {"index", s.index},
                         {"prompt_tokens", s.prompt_tokens}, {"cached_tokens", s.cached_tokens},
                         {"generated_tokens", s.generated_tokens}, {"kv_tokens", s.kv_tokens}});
      res.set_content(dump(out), "application/json");
    });
    http.Post("/v1/score", [this](const httplib::Request& req, httplib::Response& res) {
      auto p = parse_score(req.body, limits(), ids);
      if (auto* e = std::get_if<ApiError>(&p)) return send_error(res, *e);
      const auto& r = std::get<ScoreRequest>(p);
      auto a = acquire(r.model);
      if (auto* e = std::get_if<ApiError>(&a)) return send_error(res, *e);
      const ExecResult out = score(*std::get<std::shared_ptr<LoadedModel>>(a), r);
      if (out.status != 200) {
        res.status = out.status;
        return res.set_content(dump(out.body), "application/json");
      }
      res.set_content(dump(out.body), "application/json");
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      auto p = parse_tokenize(req.body, ids);
      if (auto* e = std::get_if<ApiError>(&p)) return send_error(res, *e);
      const auto& r = std::get<TokenizeRequest>(p);
      auto a = acquire(r.model);
      if (auto* e = std::get_if<ApiError>(&a)) return send_error(res, *e);
      const auto& l = std::get<std::shared_ptr<LoadedModel>>(a);
      const Tokenizer& tok = *l->ckpt.model.tokenizer;
      EncodeOptions eo;
      eo.add_special = r.add_special;
      eo.parse_special = r.parse_special;
      const auto toks = tok.encode(r.content, eo);
      json out;
      if (r.with_pieces) {
        json arr = json::array();
        for (TokenId t : toks) {
          const std::string piece = token_text(tok, t);
          arr.push_back({{"id", t}, {"piece", valid_utf8(piece) ? json(piece) : bytes_of(piece)}});
        }
        out["tokens"] = arr;
      } else {
        out["tokens"] = toks;
      }
      res.set_content(dump(out), "application/json");
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      auto p = parse_detokenize(req.body, ids);
      if (auto* e = std::get_if<ApiError>(&p)) return send_error(res, *e);
      const auto& r = std::get<DetokenizeRequest>(p);
      auto a = acquire(r.model);
      if (auto* e = std::get_if<ApiError>(&a)) return send_error(res, *e);
      const auto& l = std::get<std::shared_ptr<LoadedModel>>(a);
      const Tokenizer& tok = *l->ckpt.model.tokenizer;
      for (size_t i = 0; i < r.tokens.size(); ++i)
        if (static_cast<size_t>(r.tokens[i]) >= tok.vocab_size())
          return send_error(res, api_error(400, "'tokens[" + std::to_string(i) + "]': token id " + std::to_string(r.tokens[i]) +
                                                    " is outside the vocabulary [0, " + std::to_string(tok.vocab_size()) + ")",
                                           "tokens"));
      res.set_content(dump({{"content", tok.decode(r.tokens)}}), "application/json");
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(Endpoint::Completions, req, res);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(Endpoint::ChatCompletions, req, res);
    });
    if (batches) {
      batches->register_routes(http);
      http.Post("/v1/generate", [this](const httplib::Request& req, httplib::Response& res) { queue_generate(req, res); });
      http.Post("/v1/generate/get_results",
                [this](const httplib::Request& req, httplib::Response& res) { get_results(req, res); });
    } else {
      auto no_queue = [](const httplib::Request& req, httplib::Response& res) {
        send_error(res, api_error(404, escape_invalid_utf8(req.path) +
                                           " needs the persistent queue: start the server with --state-dir DIR",
                                  "", "not_found"));
      };
      const char* pattern = R"(/v1/(files|batches|generate)(/.*)?)";
      http.Get(pattern, no_queue);
      http.Post(pattern, no_queue);
      http.Delete(pattern, no_queue);
    }
  }

  // -------------------------------------------------------------------------------------------
  // Queue-native generate: one queue row per prompt, ids at once; results polled.

  static constexpr int64_t kMaxGeneratePrompts = 100000;

  void queue_generate(const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return send_error(res, api_error(400, "the body must be a JSON object", "", "invalid_json"));
    auto pit = body.find("prompts");
    if (pit == body.end() || !pit->is_array() || pit->empty())
      return send_error(res, api_error(400, "'prompts' must be a non-empty array of prompts (strings or token id arrays)", "prompts"));
    if (static_cast<int64_t>(pit->size()) > kMaxGeneratePrompts)
      return send_error(res, api_error(400, "'prompts' has " + std::to_string(pit->size()) + " entries; at most " +
                                                std::to_string(kMaxGeneratePrompts) + " per call (use /v1/batches for more)",
                                       "prompts"));
    if (body.contains("prompt"))
      return send_error(res, api_error(400, "give 'prompts' (a list), not 'prompt', to /v1/generate", "prompt"));
    if (auto st = body.find("stream"); st != body.end() && st->is_boolean() && st->get<bool>())
      return send_error(res, api_error(400, "'stream' is not supported by /v1/generate (poll /v1/generate/get_results)", "stream"));
    json prompts = std::move(*pit);
    body.erase("prompts");
    std::vector<queue::NewRequest> rows;
    rows.reserve(prompts.size());
    const RequestLimits lim = limits();
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (!prompts[i].is_string() && !prompts[i].is_array())
        return send_error(res, api_error(400, "'prompts[" + std::to_string(i) + "]' must be a string or an array of token ids", "prompts"));
      json one = body;
      one["prompt"] = prompts[i];
      std::string text = dump(one);
      auto parsed = parse_request(Endpoint::Completions, text, lim, ids);
      if (auto* e = std::get_if<ApiError>(&parsed)) {
        ApiError err = *e;
        if (err.param == "prompt") {
          err.param = "prompts";
          err.message = "prompts[" + std::to_string(i) + "]: " + err.message;
        }
        return send_error(res, err);
      }
      const ParsedRequest& r = std::get<ParsedRequest>(parsed);
      if (r.prompts.size() != 1)
        return send_error(res, api_error(400, "'prompts[" + std::to_string(i) + "]' must be one prompt (a string or one token id array)",
                                         "prompts"));
      if (!one.contains("model")) {
        one["model"] = r.model;  // the row names its model: workers pick it without parsing
        text = dump(one);
      }
      queue::NewRequest nr;
      nr.model = r.model;
      nr.body = std::move(text);
      nr.endpoint = "/v1/completions";
      rows.push_back(std::move(nr));
    }
    std::vector<queue::RequestId> got;
    try {
      got = queue->enqueue_many(rows);
    } catch (const queue::QueueFullError& e) {
      return send_error(res, api_error(429, e.what(), "", "queue_full"));
    } catch (const queue::StorageFullError& e) {
      return send_error(res, api_error(507, e.what(), "", "storage_full"));
    } catch (const ValueError& e) {
      return send_error(res, api_error(400, e.what()));
    }
    worker->wake();
    json out = json::array();
    for (auto id : got) out.push_back("req-" + std::to_string(id));
    res.set_content(dump({{"object", "list"}, {"request_ids", out}}), "application/json");
  }

  static std::optional<queue::RequestId> parse_request_id(const json& v) {
    if (!v.is_string()) return std::nullopt;
    const std::string s = v.get<std::string>();
    if (s.size() < 5 || s.size() > 24 || s.compare(0, 4, "req-") != 0) return std::nullopt;
    if (s.find_first_not_of("0123456789", 4) != std::string::npos) return std::nullopt;
    return static_cast<queue::RequestId>(std::stoll(s.substr(4)));
  }

  static json result_entry(const json& id, const std::optional<queue::RequestInfo>& info) {
    json e = {{"request_id", id}, {"status", "failed"}, {"response", nullptr}, {"error", nullptr}};
    if (!info) {
      e["error"] = {{"message", "no such request: " + (id.is_string() ? id.get<std::string>() : dump(id))}, {"code", "not_found"}};
      return e;
    }
    e["status"] = queue::to_string(info->state);
    if (info->state == queue::RequestState::cancelled) e["error"] = {{"message", "the request was cancelled"}, {"code", "cancelled"}};
    if (info->result) {
      const queue::Result& r = *info->result;
      json body = json::parse(r.body, nullptr, false);
      if (r.status_code == 200 && r.error.empty() && !body.is_discarded()) {
        e["response"] = std::move(body);
      } else {
        // An error result (a bad request found by the worker, an unknown model, out of attempts).
        e["status"] = "failed";
        std::string code = "http_" + std::to_string(r.status_code);
        if (!body.is_discarded() && body.contains("error") && body["error"].is_object() && body["error"].contains("code") &&
            body["error"]["code"].is_string())
          code = body["error"]["code"].get<std::string>();
        if (info->state == queue::RequestState::failed) code = "failed";
        e["error"] = {{"message", r.error.empty() ? "request failed (status " + std::to_string(r.status_code) + ")" : r.error},
                      {"code", code}, {"status_code", r.status_code}};
      }
    }
    return e;
  }

  void get_results(const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return send_error(res, api_error(400, "the body must be a JSON object", "", "invalid_json"));
    auto it = body.find("request_ids");
    if (it == body.end() || !it->is_array())
      return send_error(res, api_error(400, "'request_ids' must be an array of ids from /v1/generate", "request_ids"));
    if (static_cast<int64_t>(it->size()) > kMaxGeneratePrompts)
      return send_error(res, api_error(400, "'request_ids' has more than " + std::to_string(kMaxGeneratePrompts) + " ids", "request_ids"));
    double timeout = 0;
    if (auto t = body.find("timeout"); t != body.end() && !t->is_null()) {
      if (!t->is_number() || t->get<double>() < 0 || t->get<double>() > 60)
        return send_error(res, api_error(400, "'timeout' must be a number of seconds in [0, 60]", "timeout"));
      timeout = t->get<double>();
    }
    const json& want = *it;
    std::vector<std::optional<queue::RequestId>> rids;
    for (const auto& v : want) rids.push_back(parse_request_id(v));
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
    std::vector<std::optional<queue::RequestInfo>> infos(rids.size());
    std::vector<bool> final_(rids.size(), false);
    auto look = [&](size_t i) {
      if (rids[i]) infos[i] = queue->get(*rids[i]);
      final_[i] = !infos[i] || infos[i]->state == queue::RequestState::done ||
                  infos[i]->state == queue::RequestState::failed || infos[i]->state == queue::RequestState::cancelled;
    };
    // While waiting, each poll reads only up to the first id not final yet (rows finish roughly
    // in order), so a long list costs one lookup a poll, not one per id, and does not compete
    // with the worker for the queue; the answer is filled in by one full pass at the end.
    size_t cursor = 0;
    for (;;) {
      while (cursor < rids.size()) {
        look(cursor);
        if (!final_[cursor]) break;
        ++cursor;
      }
      if (cursor == rids.size() || Clock::now() >= deadline || draining) break;
      // The queue is a file other processes write too: polled, not signalled.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (size_t i = cursor; i < rids.size(); ++i) look(i);
    json results = json::array();
    for (size_t i = 0; i < rids.size(); ++i) results.push_back(result_entry(want[i], infos[i]));
    res.set_content(dump({{"object", "list"}, {"results", results}}), "application/json");
  }

  // -------------------------------------------------------------------------------------------
  void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    auto parsed = parse_request(endpoint, req.body, limits(), ids);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    ParsedRequest r = std::move(std::get<ParsedRequest>(parsed));
    auto acquired = acquire(r.model);
    if (auto* e = std::get_if<ApiError>(&acquired)) return send_error(res, *e);
    std::shared_ptr<LoadedModel> l = std::get<std::shared_ptr<LoadedModel>>(acquired);

    if (!r.stream) {
      ++active;
      struct Release {
        std::atomic<int64_t>& a;
        ~Release() { --a; }
      } release{active};
      ExecOptions eo;
      eo.limits = limits();
      eo.max_tokens_limit = o.max_tokens_limit;
      eo.priority = infer::SequenceRequest::kInteractive;
      eo.metrics = &metrics;
      // execute() answers on the scheduler thread; this handler thread waits for it.
      auto result = std::make_shared<std::promise<ExecResult>>();
      auto fut = result->get_future();
      execute_parsed(*l, std::move(r), eo, [result](ExecResult x) { result->set_value(std::move(x)); });
      ExecResult out = fut.get();
      res.status = out.status;
      if (out.status == 429 || out.status == 503) res.set_header("Retry-After", "1");
      res.set_content(dump(out.body), "application/json");
      return;
    }

    auto prepared = prepare_request(*l, std::move(r));
    if (auto* e = std::get_if<ApiError>(&prepared)) return send_error(res, *e);
    PreparedRequest p = std::move(std::get<PreparedRequest>(prepared));
    auto st = make_request_state(p, true, &metrics);
    const uint64_t seed = p.r.seed_given ? p.r.seed : random_seed();
    if (auto e = submit_prepared(*l, p, seed, infer::SequenceRequest::kInteractive, o.max_tokens_limit, st))
      return send_error(res, *e);
    const bool chat = endpoint == Endpoint::ChatCompletions;
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
    const int64_t created_at = std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count();
    stream_response(std::move(p.r), std::move(l), st, id, created_at, p.prompt_tokens, res);
  }

  void stream_response(ParsedRequest r, std::shared_ptr<LoadedModel> l, std::shared_ptr<RequestState> st, const std::string& id,
                       int64_t created_at, int64_t prompt_tokens, httplib::Response& res) {
    ++active;
    const bool chat = r.endpoint == Endpoint::ChatCompletions;
    auto req = std::make_shared<ParsedRequest>(std::move(r));
    auto sent_role = std::make_shared<std::vector<bool>>(st->total, false);
    auto finished_sent = std::make_shared<bool>(false);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto chunk = [=](json choice) {
      json c = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_at},
                {"model", req->model}, {"choices", json::array({std::move(choice)})}};
      if (chat) c["system_fingerprint"] = "corelm";
      return "data: " + dump(c) + "\n\n";
    };
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this](size_t, httplib::DataSink& sink) -> bool {
          const Tokenizer& tok = *l->ckpt.model.tokenizer;
          std::deque<TokenEvent> batch;
          bool done = false;
          std::string error_message;
          {
            std::unique_lock<std::mutex> lock(st->m);
            st->cv.wait_for(lock, std::chrono::milliseconds(1000), [&] { return !st->events.empty() || st->all_done(); });
            batch.swap(st->events);
            done = st->all_done();
            error_message = st->error;
          }
          std::string out;
          for (auto& e : batch) {
            if (chat && !(*sent_role)[e.choice]) {
              (*sent_role)[e.choice] = true;
              out += chunk({{"index", e.choice}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                            {"finish_reason", nullptr}});
            }
            if (e.finished) {
              json fin = {{"index", e.choice}, {"logprobs", nullptr}, {"finish_reason", finish_for_api(e.finish_reason)}};
              if (chat) fin["delta"] = json::object();
              else fin["text"] = "";
              out += chunk(fin);
              continue;
            }
            json lp = nullptr;
            if (e.has_logprob) lp = logprobs_json(*req, tok, {e});
            if (e.text.empty() && lp.is_null()) continue;
            json c = {{"index", e.choice}, {"logprobs", lp}, {"finish_reason", nullptr}};
            if (chat) c["delta"] = {{"content", e.text}};
            else c["text"] = e.text;
            out += chunk(c);
          }
          if (done) {
            if (!error_message.empty()) {
              ApiError err = api_error(500, "generation failed: " + error_message);
              out += "data: " + dump(err.to_json()) + "\n\n";
            } else if (req->include_usage) {
              int64_t completion_tokens = 0;
              {
                std::lock_guard<std::mutex> lock(st->m);
                for (const auto& c : st->choices) completion_tokens += c.completion_tokens;
              }
              json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_at},
                        {"model", req->model}, {"choices", json::array()},
                        {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                                   {"total_tokens", prompt_tokens + completion_tokens}}}};
              out += "data: " + dump(u) + "\n\n";
            }
            out += "data: [DONE]\n\n";
          } else if (out.empty()) {
            // Nothing new for a second (a long prefill or queue wait): an SSE comment, which
            // clients ignore, tells a gone client from a slow model.
            out = ": keep-alive\n\n";
          }
          if (!sink.is_writable() || !sink.write(out.data(), out.size())) {
            for (auto rid : st->ids) l->scheduler->cancel(rid);
            return false;
          }
          if (done) {
            *finished_sent = true;
            sink.done();
          }
          return true;
        },
        [=, this](bool success) {
          // The connection ended (normally or not): whatever still runs for it is cancelled.
          if (!*finished_sent)
            for (auto rid : st->ids) l->scheduler->cancel(rid);
          --active;
        });
  }

  std::string queue_metrics() const {
    std::string out;
    auto counter = [&](const char* name, const char* help, uint64_t v) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + std::to_string(v) + "\n";
    };
    counter("corelm_queue_leased_total", "Queue rows this server leased.", worker->leased_total());
    counter("corelm_queue_completed_total", "Queue rows this server stored a result for.", worker->completed_total());
    // Not corelm_queue_depth: that gauge is the schedulers' waiting requests (issue 15).
    out += "# HELP corelm_queue_rows Rows of the persistent queue by state (every server sharing the state dir).\n"
           "# TYPE corelm_queue_rows gauge\n";
    try {
      const queue::Counts c = queue->counts();
      const std::pair<const char*, int64_t> states[] = {{"queued", c.queued}, {"running", c.running}, {"done", c.done},
                                                        {"failed", c.failed}, {"cancelled", c.cancelled}};
      for (const auto& [state, n] : states)
        out += std::string("corelm_queue_rows{state=\"") + state + "\"} " + std::to_string(n) + "\n";
    } catch (const std::exception&) {
      // The file is busy or unreadable right now: the gauge is left out of this scrape.
    }
    return out;
  }

  bool drain() {
    draining = true;
    if (worker) worker->stop_leasing();
    if (batches) batches->stop();
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.drain_seconds));
    bool clean = true;
    for (const auto& [id, l] : loaded_models()) clean = l->scheduler->drain(deadline) && clean;
    if (worker) worker->finish();  // acks what the schedulers finished
    // Let the handlers write what the schedulers finished (bounded).
    const auto flush_deadline = Clock::now() + std::chrono::seconds(5);
    while (active.load() > 0 && Clock::now() < flush_deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    http.stop();
    return clean;
  }
};

Server::Server(ServeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Server::~Server() = default;

int Server::bind() {
  Impl& s = *impl_;
  const auto secs = [](double v, auto set) {
    const auto whole = static_cast<time_t>(v);
    set(whole, static_cast<time_t>((v - static_cast<double>(whole)) * 1e6));
  };
  secs(s.o.read_timeout_s, [&](time_t a, time_t b) { s.http.set_read_timeout(a, b); });
  secs(s.o.write_timeout_s, [&](time_t a, time_t b) { s.http.set_write_timeout(a, b); });
  s.http.set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>(s.o.keep_alive_timeout_s)));
  s.http.set_keep_alive_max_count(static_cast<size_t>(s.o.keep_alive_max));
  // Uploads (/v1/files) may be larger; the pre-routing handler keeps the other endpoints at
  // --max-body-bytes.
  s.http.set_payload_max_length(static_cast<size_t>(
      s.batches ? std::max<int64_t>(s.o.max_body_bytes, s.o.max_file_bytes + (1 << 20)) : s.o.max_body_bytes));
  s.http.set_tcp_nodelay(true);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half the connections; SO_REUSEADDR alone still allows a quick restart.
  s.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const int64_t threads = s.o.http_threads > 0 ? s.o.http_threads : std::min<int64_t>(1024, s.o.slots + s.o.max_queue + 16);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.setup_routes();
  if (s.o.port == 0) {
    s.bound_port = s.http.bind_to_any_port(s.o.host);
  } else {
    s.bound_port = s.http.bind_to_port(s.o.host, s.o.port) ? s.o.port : -1;
  }
  CORELM_CHECK(s.bound_port > 0, IOError, "cannot listen on ", s.o.host, ":", s.o.port,
               " (address in use, not a local address, or not permitted)");
  s.http.raise_backlog(1024);
  return s.bound_port;
}

void Server::serve() {
  Impl& s = *impl_;
  CORELM_CHECK(s.bound_port > 0, ValueError, "Server::serve before bind");
  s.loader = std::thread([&s] { s.load_pinned(); });
  if (s.worker) s.worker->start();
  if (s.batches) s.batches->start();
  s.http.listen_after_bind();
  if (s.loader.joinable()) s.loader.join();
}

bool Server::shutdown() { return impl_->drain(); }
bool Server::ready() const { return impl_->ready(); }
std::vector<std::string> Server::model_ids() const { return impl_->ids; }
int Server::port() const { return impl_->bound_port; }

}  // namespace corelm::serve
