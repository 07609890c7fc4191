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
#include "serve/metrics.h"
#include "serve/request.h"

namespace corelm::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

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

struct Loaded {
  explicit Loaded(model::Checkpoint c) : ckpt(std::move(c)) {}
  model::Checkpoint ckpt;
  std::unique_ptr<infer::ChatTemplate> chat_template;
  std::string chat_template_error;
  std::vector<TokenId> eos_ids;       // every EOS id (checkpoint + tokenizer)
  std::vector<TokenId> chat_stop_ids; // end-of-turn tokens the chat template emits
  std::unique_ptr<infer::Scheduler> scheduler;  // declared last: destroyed before the model
  ~Loaded() { scheduler.reset(); }
};

struct ModelEntry {
  std::string id, path;
  bool pinned = false;  // --model: loaded at start, never unloaded
  enum class State { Unloaded, Loading, Ready, Failed } state = State::Unloaded;
  std::string error;
  std::shared_ptr<Loaded> loaded;
  Clock::time_point last_used{};
};

std::shared_ptr<Loaded> load_one(const std::string& path, const ServeOptions& o) {
  auto l = std::make_shared<Loaded>(model::load_model(path));
  CORELM_CHECK(l->ckpt.model.tokenizer != nullptr, ValueError, path, ": the model has no tokenizer");
  if (o.precision != model::Precision::F32) l->ckpt.model.decoder.prepare_inference(o.precision);
  const Tokenizer& tok = *l->ckpt.model.tokenizer;
  for (int64_t id : l->ckpt.eos_ids)
    if (id >= 0 && static_cast<size_t>(id) < tok.vocab_size()) l->eos_ids.push_back(static_cast<TokenId>(id));
  if (tok.eos_id()) l->eos_ids.push_back(*tok.eos_id());
  // Chat templates end a turn with their own token; stop there too (when the vocabulary has it).
  for (const char* t : {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>"})
    if (auto id = tok.token_to_id(t)) l->chat_stop_ids.push_back(*id);
  if (!l->ckpt.eos_token.empty())
    if (auto id = tok.token_to_id(l->ckpt.eos_token)) l->chat_stop_ids.push_back(*id);
  try {
    l->chat_template = std::make_unique<infer::ChatTemplate>(
        l->ckpt.chat_template.empty() ? infer::ChatTemplate::default_source() : l->ckpt.chat_template);
  } catch (const std::exception& e) {
    // The model stays usable for completions; chat requests get this message as a 400.
    l->chat_template_error = e.what();
  }
  infer::SchedulerOptions so;
  so.slots = o.slots;
  so.context = o.ctx;
  so.max_queue = o.max_queue;
  l->scheduler = std::make_unique<infer::Scheduler>(l->ckpt.model.decoder, tok, so);
  return l;
}

bool is_model_path(const fs::path& p) {
  std::error_code ec;
  if (fs::is_directory(p, ec)) return fs::exists(p / "config.json", ec);
  return fs::is_regular_file(p, ec) && p.extension() == ".gguf";
}

// ---------------------------------------------------------------------------------------------
// One HTTP request's generation state, shared by the observers of its prompts and the handler.

struct TokenEvent {
  int choice = 0;
  bool finished = false;
  TokenId token = 0;
  std::string text, finish_reason;
  bool has_logprob = false;
  infer::TokenLogprob logprob;
  std::vector<infer::TokenLogprob> top;
};

struct ChoiceResult {
  std::string text, finish_reason;
  int64_t completion_tokens = 0;
  bool done = false;
  std::vector<TokenEvent> logprobs;  // per token, when requested
};

struct RequestState {
  std::mutex m;
  std::condition_variable cv;
  bool stream = false, want_logprobs = false;
  int n = 1;
  int finished = 0, total = 0;
  std::string error;               // a failed request (on_error)
  std::deque<TokenEvent> events;   // stream: waiting to be written
  std::vector<ChoiceResult> choices;
  std::vector<Clock::time_point> last_token;
  std::vector<bool> got_token;
  Clock::time_point start = Clock::now();
  Metrics* metrics = nullptr;
  std::vector<infer::RequestId> ids;  // scheduler requests, for cancel
  bool all_done() const { return finished >= total || !error.empty(); }
};

class Observer : public infer::RequestObserver {
 public:
  Observer(std::shared_ptr<RequestState> st, int prompt_index) : st_(std::move(st)), base_(prompt_index * st_->n) {}
  void on_token(int index, TokenId token, const std::string& text, const infer::TokenLogprob* lp,
                const std::vector<infer::TokenLogprob>* top) override {
    const int c = base_ + index;
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(st_->m);
    if (c < 0 || c >= st_->total) return;
    if (!st_->got_token[c]) st_->metrics->ttft.observe(std::chrono::duration<double>(now - st_->start).count());
    else st_->metrics->inter_token.observe(std::chrono::duration<double>(now - st_->last_token[c]).count());
    st_->got_token[c] = true;
    st_->last_token[c] = now;
    st_->metrics->add_generated_token();
    TokenEvent e;
    e.choice = c;
    e.token = token;
    e.text = text;
    if (lp && st_->want_logprobs) {
      e.has_logprob = true;
      e.logprob = *lp;
      if (top) e.top = *top;
    }
    if (st_->stream) {
      st_->events.push_back(std::move(e));
    } else {
      if (e.has_logprob) st_->choices[c].logprobs.push_back(std::move(e));
    }
    st_->cv.notify_all();
  }
  void on_finished(int index, const std::string& finish_reason, const std::string& text,
                   int64_t completion_tokens) override {
    const int c = base_ + index;
    std::lock_guard<std::mutex> lock(st_->m);
    if (c < 0 || c >= st_->total || st_->choices[c].done) return;
    auto& r = st_->choices[c];
    r.done = true;
    r.text = text;
    r.finish_reason = finish_reason;
    r.completion_tokens = completion_tokens;
    ++st_->finished;
    if (st_->stream) {
      TokenEvent e;
      e.choice = c;
      e.finished = true;
      e.finish_reason = finish_reason;
      st_->events.push_back(std::move(e));
    }
    st_->cv.notify_all();
  }
  void on_error(const std::string& message) override {
    std::lock_guard<std::mutex> lock(st_->m);
    st_->error = message.empty() ? "generation failed" : message;
    st_->cv.notify_all();
  }

 private:
  std::shared_ptr<RequestState> st_;
  int base_;
};

std::string random_hex(size_t n) {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(m);
  static const char* d = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& ch : s) ch = d[rng() & 15];
  return s;
}

uint64_t random_seed() {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(m);
  return rng();
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
  }

  ~Impl() {
    if (loader.joinable()) loader.join();
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
      std::shared_ptr<Loaded> l;
      std::string err;
      try {
        l = load_one(p, o);
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
  std::variant<std::shared_ptr<Loaded>, ApiError> acquire(const std::string& id) {
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
      std::shared_ptr<Loaded> drop = std::move(victim->loaded);
      victim->state = ModelEntry::State::Unloaded;
      std::fprintf(stderr, "corelm: unloaded model '%s' (least recently used)\n", victim->id.c_str());
      lock.unlock();
      drop.reset();  // joins its scheduler outside the lock
      lock.lock();
    }
    e.state = ModelEntry::State::Loading;
    const std::string path = e.path;
    lock.unlock();
    std::shared_ptr<Loaded> l;
    std::string err;
    try {
      l = load_one(path, o);
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

  std::vector<std::pair<std::string, std::shared_ptr<Loaded>>> loaded_models() const {
    std::lock_guard<std::mutex> lock(models_m);
    std::vector<std::pair<std::string, std::shared_ptr<Loaded>>> out;
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
                                  "/health", "/metrics", "/slots"};
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
      res.set_content(metrics.render(g), "text/plain; version=0.0.4");
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
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      auto p = parse_tokenize(req.body, ids);
      if (auto* e = std::get_if<ApiError>(&p)) return send_error(res, *e);
      const auto& r = std::get<TokenizeRequest>(p);
      auto a = acquire(r.model);
      if (auto* e = std::get_if<ApiError>(&a)) return send_error(res, *e);
      const auto& l = std::get<std::shared_ptr<Loaded>>(a);
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
      const auto& l = std::get<std::shared_ptr<Loaded>>(a);
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
  }

  // -------------------------------------------------------------------------------------------
  std::shared_ptr<const infer::Grammar> grammar_for(const ParsedRequest& r) {
    switch (r.format) {
      case OutputFormat::Text: return nullptr;
      case OutputFormat::JsonObject: return infer::Grammar::json_object();
      case OutputFormat::JsonSchema: return infer::Grammar::json_schema(r.schema);
      case OutputFormat::Regex: return infer::Grammar::regex(r.regex);
      case OutputFormat::Choices: return infer::Grammar::choices(r.choices);
    }
    return nullptr;
  }

  json logprobs_json(const ParsedRequest& r, const Tokenizer& tok, const std::vector<TokenEvent>& events) {
    if (r.top_logprobs < 0) return nullptr;
    if (r.endpoint == Endpoint::ChatCompletions) {
      json content = json::array();
      for (const auto& e : events) {
        const std::string t = token_text(tok, e.token);
        json top = json::array();
        for (const auto& alt : e.top) {
          const std::string at = token_text(tok, alt.token);
          top.push_back({{"token", at}, {"logprob", alt.logprob}, {"bytes", bytes_of(at)}});
        }
        content.push_back({{"token", t}, {"logprob", e.logprob.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
      }
      return {{"content", content}};
    }
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    int64_t off = 0;
    for (const auto& e : events) {
      const std::string t = token_text(tok, e.token);
      tokens.push_back(t);
      lps.push_back(e.logprob.logprob);
      json top = json::object();
      for (const auto& alt : e.top) top[token_text(tok, alt.token)] = alt.logprob;
      tops.push_back(top);
      offsets.push_back(off);
      off += static_cast<int64_t>(t.size());
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  static std::string finish_for_api(const std::string& f) { return f == "length" ? "length" : "stop"; }

  void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    auto parsed = parse_request(endpoint, req.body, limits(), ids);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    ParsedRequest r = std::move(std::get<ParsedRequest>(parsed));
    auto acquired = acquire(r.model);
    if (auto* e = std::get_if<ApiError>(&acquired)) return send_error(res, *e);
    std::shared_ptr<Loaded> l = std::get<std::shared_ptr<Loaded>>(acquired);
    const Tokenizer& tok = *l->ckpt.model.tokenizer;
    const int64_t context = l->scheduler->context();
    const bool chat = endpoint == Endpoint::ChatCompletions;

    // Prompts -> ids.
    std::vector<std::vector<TokenId>> prompts;
    if (chat) {
      if (!l->chat_template)
        return send_error(res, api_error(400, "the model's chat template cannot be used: " + l->chat_template_error, "messages",
                                         "unsupported_chat_template"));
      std::string text;
      try {
        text = l->chat_template->apply(r.messages, true, l->ckpt.bos_token, l->ckpt.eos_token);
      } catch (const std::exception& e) {
        return send_error(res, api_error(400, std::string("the chat template failed: ") + e.what(), "messages", "chat_template_error"));
      }
      EncodeOptions eo;
      eo.add_special = false;   // the template writes BOS itself where the model wants one
      eo.parse_special = true;  // its <|im_start|>-style markers are special tokens
      prompts.push_back(tok.encode(text, eo));
    } else {
      for (size_t i = 0; i < r.prompts.size(); ++i) {
        const Prompt& p = r.prompts[i];
        if (p.is_ids) {
          for (TokenId t : p.ids)
            if (static_cast<size_t>(t) >= tok.vocab_size())
              return send_error(res, api_error(400, "'prompt': token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                                        std::to_string(tok.vocab_size()) + ")", "prompt"));
          prompts.push_back(p.ids);
        } else {
          EncodeOptions eo;
          eo.add_special = true;
          prompts.push_back(tok.encode(p.text, eo));
        }
      }
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto& ids_i = prompts[i];
      if (ids_i.empty()) {
        if (tok.bos_id()) ids_i.push_back(*tok.bos_id());
        else if (tok.eos_id()) ids_i.push_back(*tok.eos_id());
        else return send_error(res, api_error(400, "the prompt is empty and the tokenizer has no BOS token to start from", chat ? "messages" : "prompt"));
      }
      if (static_cast<int64_t>(ids_i.size()) >= context)
        return send_error(res, api_error(400, std::string(chat ? "the rendered messages are " : "the prompt") +
                                                  (prompts.size() > 1 ? " " + std::to_string(i) : "") + (chat ? "" : " is ") +
                                                  std::to_string(ids_i.size()) + " tokens; the context is " +
                                                  std::to_string(context) + " tokens (at least one must be left to generate)",
                                         chat ? "messages" : "prompt", "context_length_exceeded"));
    }
    if (r.max_tokens && *r.max_tokens >= context)
      return send_error(res, api_error(400, "'max_tokens' " + std::to_string(*r.max_tokens) + " does not fit the context of " +
                                                std::to_string(context) + " tokens", "max_tokens"));
    for (const auto& [id, bias] : r.logit_bias)
      if (static_cast<size_t>(id) >= tok.vocab_size())
        return send_error(res, api_error(400, "'logit_bias': token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                                  std::to_string(tok.vocab_size()) + ")", "logit_bias"));
    std::shared_ptr<const infer::Grammar> grammar;
    try {
      grammar = grammar_for(r);
    } catch (const std::exception& e) {
      const char* param = r.format == OutputFormat::Regex ? "regex" : r.format == OutputFormat::Choices ? "choices" : "response_format";
      return send_error(res, api_error(400, e.what(), param, "unsupported_grammar"));
    }

    auto st = std::make_shared<RequestState>();
    st->stream = r.stream;
    st->want_logprobs = r.top_logprobs >= 0;
    st->n = r.n;
    st->total = static_cast<int>(prompts.size()) * r.n;
    st->choices.resize(st->total);
    st->last_token.resize(st->total);
    st->got_token.assign(st->total, false);
    st->metrics = &metrics;
    const uint64_t seed = r.seed_given ? r.seed : random_seed();
    int64_t prompt_tokens = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      infer::SequenceRequest sr;
      sr.prompt = prompts[i];
      prompt_tokens += static_cast<int64_t>(sr.prompt.size());
      const int64_t room = context - static_cast<int64_t>(sr.prompt.size());
      const int64_t def = chat ? std::min<int64_t>(o.max_tokens_limit, room) : 16;
      sr.max_new_tokens = std::min<int64_t>(r.max_tokens.value_or(def), room);
      sr.n = r.n;
      // Each prompt of a list draws its own streams (seed + i*n + k), so prompts do not share samples.
      sr.seed = seed + static_cast<uint64_t>(i) * static_cast<uint64_t>(r.n);
      sr.sampling.temperature = r.temperature;
      sr.sampling.top_p = r.top_p;
      sr.presence_penalty = r.presence_penalty;
      sr.frequency_penalty = r.frequency_penalty;
      sr.logit_bias = r.logit_bias;
      sr.stop = r.stop;
      sr.eos_ids = l->eos_ids;
      if (chat) sr.eos_ids.insert(sr.eos_ids.end(), l->chat_stop_ids.begin(), l->chat_stop_ids.end());
      sr.top_logprobs = r.top_logprobs;
      sr.grammar = grammar;
      try {
        st->ids.push_back(l->scheduler->submit(std::move(sr), std::make_shared<Observer>(st, static_cast<int>(i))));
      } catch (const std::exception& e) {
        for (auto id : st->ids) l->scheduler->cancel(id);
        if (dynamic_cast<const infer::QueueFullError*>(&e))
          return send_error(res, api_error(429, std::string("the server is busy (queue full): ") + e.what(), "", "queue_full"));
        if (dynamic_cast<const infer::DrainingError*>(&e))
          return send_error(res, api_error(503, "the server is shutting down", "", "draining"));
        if (dynamic_cast<const ValueError*>(&e)) return send_error(res, api_error(400, e.what()));
        return send_error(res, api_error(500, e.what()));
      }
    }
    metrics.add_prompt_tokens(static_cast<uint64_t>(prompt_tokens));

    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
    const int64_t created_at = std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count();
    if (r.stream) return stream_response(std::move(r), std::move(l), st, id, created_at, prompt_tokens, res);

    ++active;
    struct Release {
      std::atomic<int64_t>& a;
      ~Release() { --a; }
    } release{active};
    {
      std::unique_lock<std::mutex> lock(st->m);
      st->cv.wait(lock, [&] { return st->all_done(); });
    }
    if (!st->error.empty()) {
      for (auto rid : st->ids) l->scheduler->cancel(rid);
      return send_error(res, api_error(500, "generation failed: " + st->error));
    }
    json choices = json::array();
    int64_t completion_tokens = 0;
    for (int c = 0; c < st->total; ++c) {
      const auto& ch = st->choices[c];
      if (ch.finish_reason == "cancelled" || ch.finish_reason == "error")
        return send_error(res, api_error(ch.finish_reason == "cancelled" ? 503 : 500, "generation " + ch.finish_reason));
      completion_tokens += ch.completion_tokens;
      json lp = logprobs_json(r, tok, ch.logprobs);
      if (chat)
        choices.push_back({{"index", c}, {"message", {{"role", "assistant"}, {"content", ch.text}}}, {"logprobs", lp},
                           {"finish_reason", finish_for_api(ch.finish_reason)}});
      else
        choices.push_back({{"index", c}, {"text", ch.text}, {"logprobs", lp}, {"finish_reason", finish_for_api(ch.finish_reason)}});
    }
    json out = {{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created_at},
                {"model", r.model},
                {"choices", choices},
                {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                           {"total_tokens", prompt_tokens + completion_tokens}}}};
    if (chat) out["system_fingerprint"] = "corelm";
    res.set_content(dump(out), "application/json");
  }

  void stream_response(ParsedRequest r, std::shared_ptr<Loaded> l, std::shared_ptr<RequestState> st, const std::string& id,
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

  bool drain() {
    draining = true;
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.drain_seconds));
    bool clean = true;
    for (const auto& [id, l] : loaded_models()) clean = l->scheduler->drain(deadline) && clean;
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
  s.http.set_payload_max_length(static_cast<size_t>(s.o.max_body_bytes));
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
  s.http.listen_after_bind();
  if (s.loader.joinable()) s.loader.join();
}

bool Server::shutdown() { return impl_->drain(); }
bool Server::ready() const { return impl_->ready(); }
std::vector<std::string> Server::model_ids() const { return impl_->ids; }
int Server::port() const { return impl_->bound_port; }

}  // namespace corelm::serve
