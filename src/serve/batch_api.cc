#include "batch_api.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

namespace corelm::serve {

// ---- HTTP --------------------------------------------------------------------------------

namespace {

using json = nlohmann::json;
using queue::BatchInfo;
using queue::BatchRow;
using queue::BatchStatus;
using queue::FileInfo;

json time_or_null(const std::optional<double>& t) {
  return t ? json(static_cast<int64_t>(std::floor(*t))) : json(nullptr);
}

json file_json(const FileInfo& f) {
  return {{"id", f.id},
          {"object", "file"},
          {"bytes", f.bytes},
          {"created_at", static_cast<int64_t>(std::floor(f.created_at))},
          {"filename", f.filename},
          {"purpose", f.purpose},
          {"status", "processed"},
          {"status_details", nullptr}};
}

json opt_json_text(const std::string& text) {
  if (text.empty()) return nullptr;
  json j = json::parse(text, nullptr, false);
  return j.is_discarded() ? json(nullptr) : j;
}

json batch_json(const BatchInfo& b) {
  json o = {{"id", b.id},
            {"object", "batch"},
            {"endpoint", b.endpoint},
            {"errors", opt_json_text(b.errors)},
            {"input_file_id", b.input_file_id},
            {"completion_window", b.completion_window},
            {"status", queue::to_string(b.status)},
            {"output_file_id", b.output_file_id ? json(*b.output_file_id) : json(nullptr)},
            {"error_file_id", b.error_file_id ? json(*b.error_file_id) : json(nullptr)},
            {"created_at", static_cast<int64_t>(std::floor(b.created_at))},
            {"in_progress_at", time_or_null(b.in_progress_at)},
            {"expires_at", time_or_null(b.expires_at)},
            {"finalizing_at", time_or_null(b.finalizing_at)},
            {"completed_at", time_or_null(b.completed_at)},
            {"failed_at", time_or_null(b.failed_at)},
            {"expired_at", time_or_null(b.expired_at)},
            {"cancelling_at", time_or_null(b.cancelling_at)},
            {"cancelled_at", time_or_null(b.cancelled_at)},
            {"request_counts",
             {{"total", b.counts.total}, {"completed", b.counts.completed}, {"failed", b.counts.failed}}},
            {"metadata", opt_json_text(b.metadata)}};
  return o;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  res.set_content(dump(e.to_json()), "application/json");
}

void send_json(httplib::Response& res, const json& j) { res.set_content(dump(j), "application/json"); }

// A stored body as JSON (in its own key order); a body that is not JSON travels as a string.
nlohmann::ordered_json body_json(const std::string& body) {
  auto j = nlohmann::ordered_json::parse(body, nullptr, false);
  if (j.is_discarded()) return body;
  return j;
}

bool is_output_row(const BatchRow& r) {
  return r.state == queue::RequestState::done && r.result && r.result->status_code == 200;
}

// One line of the output file (status 200) or of the error file (everything else), with '\n'.
std::string render_row(const BatchRow& r, BatchStatus batch_status) {
  nlohmann::ordered_json line;
  line["id"] = "batch_req_" + std::to_string(r.id);
  line["custom_id"] = r.custom_id;
  if (r.result && r.state == queue::RequestState::done) {
    nlohmann::ordered_json body = body_json(r.result->body);
    line["response"] = {{"status_code", r.result->status_code},
                        {"request_id", "req-" + std::to_string(r.id)},
                        {"body", body}};
    if (r.result->status_code == 200) {
      line["error"] = nullptr;
    } else {
      std::string code = "request_failed", message = r.result->error;
      if (body.is_object() && body.contains("error") && body["error"].is_object()) {
        const auto& e = body["error"];
        if (e.contains("code") && e["code"].is_string()) code = e["code"].get<std::string>();
        if (e.contains("message") && e["message"].is_string() && message.empty())
          message = e["message"].get<std::string>();
      }
      if (message.empty()) message = "the request failed with status " + std::to_string(r.result->status_code);
      line["error"] = {{"code", code}, {"message", message}};
    }
  } else if (r.state == queue::RequestState::cancelled) {
    line["response"] = nullptr;
    bool expired = batch_status == BatchStatus::expired;
    line["error"] = {{"code", expired ? "batch_expired" : "batch_cancelled"},
                     {"message", expired ? "the batch expired before this request ran"
                                         : "the batch was cancelled before this request ran"}};
  } else {
    line["response"] = nullptr;
    line["error"] = {{"code", "server_error"}, {"message", r.result ? r.result->error : std::string("no result")}};
  }
  return line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

int64_t query_int(const httplib::Request& req, const char* name, int64_t def, int64_t lo, int64_t hi) {
  if (!req.has_param(name)) return def;
  const std::string v = req.get_param_value(name);
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty() || n < lo || n > hi)
    throw ApiError(api_error(400, std::string("'") + name + "' must be an integer in " + std::to_string(lo) + ".." +
                                      std::to_string(hi) + " (got '" + v + "')",
                             name));
  return n;
}

}  // namespace

struct BatchApi::Impl {
  BatchApiContext ctx;
  std::thread monitor;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  // A batch that did not fit the queue is validated again after a pause, not at every tick.
  std::map<std::string, std::chrono::steady_clock::time_point> retry_after;

  queue::Queue& q() { return *ctx.queue; }

  // Maps the queue's and the handler's errors to OpenAI's shape.
  template <typename F>
  void guarded(httplib::Response& res, F&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const queue::NotFoundError& e) {
      send_error(res, api_error(404, e.what()));
    } catch (const queue::QueueFullError& e) {
      send_error(res, api_error(429, e.what(), "", "queue_full"));
    } catch (const queue::StorageFullError& e) {
      send_error(res, api_error(507, e.what(), "", "storage_full"));
    } catch (const ValueError& e) {
      send_error(res, api_error(400, e.what()));
    } catch (const std::exception& e) {
      send_error(res, api_error(500, e.what()));
    }
  }

  // ---- files ----
  void upload(const httplib::Request& req, httplib::Response& res) {
    if (!req.is_multipart_form_data())
      throw ApiError(api_error(400, "POST /v1/files takes multipart/form-data with parts 'file' and 'purpose'"));
    if (!req.has_file("purpose")) throw ApiError(api_error(400, "the 'purpose' part is required", "purpose"));
    if (!req.has_file("file")) throw ApiError(api_error(400, "the 'file' part is required", "file"));
    const std::string purpose = req.get_file_value("purpose").content;
    if (purpose != "batch")
      throw ApiError(api_error(400, "purpose '" + purpose + "' is not supported here (only 'batch')", "purpose"));
    const httplib::MultipartFormData file = req.get_file_value("file");
    if (static_cast<int64_t>(file.content.size()) > ctx.max_file_bytes)
      throw ApiError(api_error(413, "the file is " + std::to_string(file.content.size()) +
                                        " bytes, above this server's limit of " + std::to_string(ctx.max_file_bytes) +
                                        " (--max-file-bytes)",
                               "file", "file_too_large"));
    std::string name = file.filename.empty() ? std::string("upload.jsonl") : file.filename;
    send_json(res, file_json(q().add_file(purpose, name, file.content)));
  }

  FileInfo file_or_404(const std::string& id) {
    auto f = q().get_file(id);
    if (!f) throw ApiError(api_error(404, "No such File object: " + id, "file_id"));
    return *f;
  }

  void file_content(const std::string& id, httplib::Response& res) {
    FileInfo f = file_or_404(id);
    if (f.kind == queue::FileKind::upload) {
      auto content = q().file_content(id);
      if (!content) throw ApiError(api_error(404, "No such File object: " + id, "file_id"));
      res.set_content(std::move(*content), "application/octet-stream");
      return;
    }
    auto b = f.batch_id ? q().get_batch(*f.batch_id) : std::nullopt;
    if (!b) throw ApiError(api_error(404, "the batch of file " + id + " is gone", "file_id"));
    // Rendered while it is sent, page by page from the results table: memory stays constant
    // whatever the batch's size.
    queue::Queue* queue = ctx.queue;
    const bool output = f.kind == queue::FileKind::output;
    const std::string batch_id = b->id;
    const BatchStatus status = b->status;
    res.set_chunked_content_provider("application/octet-stream",
                                     [queue, output, batch_id, status](size_t, httplib::DataSink& sink) {
                                       bool ok = true;
                                       queue->for_each_result(batch_id, [&](const BatchRow& r) {
                                         if (is_output_row(r) != output) return true;
                                         std::string line = render_row(r, status);
                                         ok = sink.write(line.data(), line.size());
                                         return ok;
                                       });
                                       if (ok) sink.done();
                                       return ok;
                                     });
  }

  // ---- batches ----
  void create(const httplib::Request& req, httplib::Response& res) {
    json b = json::parse(req.body, nullptr, false);
    if (b.is_discarded() || !b.is_object())
      throw ApiError(api_error(400, "the request body must be a JSON object"));
    auto str = [&](const char* key) {
      auto it = b.find(key);
      if (it == b.end() || it->is_null()) throw ApiError(api_error(400, std::string("'") + key + "' is required", key));
      if (!it->is_string()) throw ApiError(api_error(400, std::string("'") + key + "' must be a string", key));
      return it->get<std::string>();
    };
    std::string input = str("input_file_id"), endpoint = str("endpoint"), window = str("completion_window");
    if (endpoint != "/v1/completions" && endpoint != "/v1/chat/completions")
      throw ApiError(api_error(400, "endpoint '" + endpoint + "' is not supported (use /v1/completions or /v1/chat/completions)",
                               "endpoint"));
    std::string metadata;
    if (auto it = b.find("metadata"); it != b.end() && !it->is_null()) metadata = it->dump();
    auto f = q().get_file(input);
    if (!f) throw ApiError(api_error(404, "No such File object: " + input, "input_file_id"));
    try {
      send_json(res, batch_json(q().create_batch(input, endpoint, window, metadata)));
    } catch (const queue::NotFoundError& e) {
      throw ApiError(api_error(404, e.what(), "input_file_id"));
    } catch (const ValueError& e) {
      const std::string m = e.what();
      const char* param = m.find("completion_window") != std::string::npos ? "completion_window"
                          : m.find("metadata") != std::string::npos      ? "metadata"
                                                                         : "input_file_id";
      throw ApiError(api_error(400, m, param));
    }
    wake();
  }

  BatchInfo batch_or_404(const std::string& id) {
    auto b = q().get_batch(id);
    if (!b) throw ApiError(api_error(404, "No such Batch object: " + id, "batch_id"));
    return *b;
  }

  void cancel(const std::string& id, httplib::Response& res) {
    BatchInfo b = batch_or_404(id);
    if (b.status != BatchStatus::cancelling &&
        !q().transition_batch(id, BatchStatus::in_progress, BatchStatus::cancelling) &&
        !q().transition_batch(id, BatchStatus::validating, BatchStatus::cancelling)) {
      b = batch_or_404(id);
      if (b.status != BatchStatus::cancelling)
        throw ApiError(api_error(400, std::string("Cannot cancel a batch with status '") + queue::to_string(b.status) + "'.",
                                 "batch_id"));
    }
    wake();
    send_json(res, batch_json(batch_or_404(id)));
  }

  // ---- the monitor ----
  void wake() { cv.notify_all(); }

  // Every line checked; the first 1000 errors are reported (OpenAI's shape), nothing enqueued
  // when there is one.
  void validate(const BatchInfo& b) {
    auto now = std::chrono::steady_clock::now();
    if (auto it = retry_after.find(b.id); it != retry_after.end() && now < it->second) return;
    auto content = q().file_content(b.input_file_id);
    json errors = json::array();
    int64_t n_errors = 0;
    auto add_error = [&](const BatchLineError& e) {
      if (++n_errors > 1000) return;
      errors.push_back({{"code", e.code},
                        {"line", e.line > 0 ? json(e.line) : json(nullptr)},
                        {"message", e.message},
                        {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
    };
    std::vector<queue::NewRequest> rows;
    if (!content) {
      add_error({"invalid_file", 0, "the input file " + b.input_file_id + " was deleted before the batch started", ""});
    } else {
      const std::vector<std::string> models = ctx.model_ids ? ctx.model_ids() : std::vector<std::string>{};
      std::unordered_set<std::string> seen;
      std::string_view all(*content);
      int64_t line_no = 0, n_requests = 0;
      size_t pos = 0;
      while (pos < all.size()) {
        size_t nl = all.find('\n', pos);
        std::string_view line = all.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        pos = nl == std::string_view::npos ? all.size() : nl + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank lines (a trailing newline)
        if (++n_requests > ctx.max_batch_requests) {
          add_error({"batch_too_large", line_no,
                     "line " + std::to_string(line_no) + ": the file holds more than " +
                         std::to_string(ctx.max_batch_requests) + " requests, the most one batch may have; split it",
                     ""});
          break;
        }
        auto r = parse_batch_line(line, line_no, b.endpoint, models, ctx.limits);
        if (auto* e = std::get_if<BatchLineError>(&r)) {
          add_error(*e);
          continue;
        }
        auto& row = std::get<queue::NewRequest>(r);
        if (!seen.insert(*row.custom_id).second) {
          add_error({"duplicate_custom_id", line_no,
                     "line " + std::to_string(line_no) + ": custom_id '" + *row.custom_id +
                         "' appears more than once in the file (each request needs a unique custom_id)",
                     "custom_id"});
          continue;
        }
        if (n_errors == 0) rows.push_back(std::move(row));
      }
      if (line_no == 0 || (rows.empty() && n_errors == 0))
        add_error({"empty_file", 0, "the input file " + b.input_file_id + " has no requests", ""});
    }
    if (n_errors > 0) {
      q().fail_batch(b.id, dump(json{{"object", "list"}, {"data", errors}}));
      retry_after.erase(b.id);
      return;
    }
    try {
      q().start_batch(b.id, std::move(rows));
      retry_after.erase(b.id);
    } catch (const queue::QueueFullError&) {
      retry_after[b.id] = now + std::chrono::seconds(2);  // it starts when the queue has room
    } catch (const queue::StorageFullError&) {
      retry_after[b.id] = now + std::chrono::seconds(2);
    }
  }

  // Counts the bytes of the output and error files (rendered once, streamed: constant memory);
  // -1 for a file with no line (not created, as OpenAI leaves it null).
  void finalize(const std::string& id, BatchStatus from, BatchStatus to) {
    int64_t out = 0, err = 0, n_out = 0, n_err = 0;
    q().for_each_result(id, [&](const BatchRow& r) {
      int64_t bytes = static_cast<int64_t>(render_row(r, to).size());
      if (is_output_row(r)) out += bytes, ++n_out;
      else err += bytes, ++n_err;
      return true;
    });
    q().finish_batch(id, from, to, n_out ? out : -1, n_err ? err : -1);
  }

  bool past_expiry(const BatchInfo& b) const {
    if (!b.expires_at) return false;
    double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    return now >= *b.expires_at;
  }

  // No row queued or running. After cancel_batch a row can still come back to queued (its
  // lease was reclaimed in between): the next tick cancels it, and only then the batch ends.
  bool settled(const std::string& id) {
    queue::Counts c = q().counts(id);
    return c.queued + c.running == 0;
  }

  void tick() {
    for (const std::string& id : q().batches_in(BatchStatus::validating)) {
      auto b = q().get_batch(id);
      if (!b) continue;
      if (past_expiry(*b)) {
        q().finish_batch(id, BatchStatus::validating, BatchStatus::expired, -1, -1);
        continue;
      }
      validate(*b);
    }
    for (const std::string& id : q().batches_in(BatchStatus::in_progress)) {
      auto b = q().get_batch(id);
      if (!b) continue;
      if (past_expiry(*b)) {
        q().cancel_batch(id);
        if (settled(id)) finalize(id, BatchStatus::in_progress, BatchStatus::expired);
        continue;
      }
      if (settled(id) && q().transition_batch(id, BatchStatus::in_progress, BatchStatus::finalizing))
        finalize(id, BatchStatus::finalizing, BatchStatus::completed);
    }
    // A batch left in finalizing (its server died mid-way) is finished by whoever sees it.
    for (const std::string& id : q().batches_in(BatchStatus::finalizing))
      finalize(id, BatchStatus::finalizing, BatchStatus::completed);
    for (const std::string& id : q().batches_in(BatchStatus::cancelling)) {
      q().cancel_batch(id);
      if (settled(id)) finalize(id, BatchStatus::cancelling, BatchStatus::cancelled);
    }
  }

  void run_monitor() {
    std::unique_lock lk(mu);
    while (!stopping) {
      lk.unlock();
      try {
        tick();
      } catch (const std::exception& e) {
        // A busy or full queue: the next tick tries again; nothing is half-applied (every
        // step is one transaction).
        last_error = e.what();
      }
      lk.lock();
      cv.wait_for(lk, std::chrono::duration<double>(ctx.monitor_interval_s), [&] { return stopping; });
    }
  }
  std::string last_error;
};

BatchApi::BatchApi(BatchApiContext ctx) : impl_(std::make_unique<Impl>()) {
  if (!ctx.queue) throw ValueError("BatchApi: the queue is null");
  if (!(ctx.monitor_interval_s > 0)) throw ValueError("BatchApi: monitor_interval_s must be > 0");
  if (ctx.max_file_bytes < 1) throw ValueError("BatchApi: max_file_bytes must be >= 1");
  if (ctx.max_batch_requests < 1) throw ValueError("BatchApi: max_batch_requests must be >= 1");
  impl_->ctx = std::move(ctx);
}

BatchApi::~BatchApi() { stop(); }

void BatchApi::start() {
  std::lock_guard lk(impl_->mu);
  if (impl_->monitor.joinable()) return;
  impl_->stopping = false;
  impl_->monitor = std::thread([this] { impl_->run_monitor(); });
}

void BatchApi::stop() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->monitor.joinable()) impl_->monitor.join();
}

void BatchApi::register_routes(httplib::Server& http) {
  Impl* d = impl_.get();
  http.Post("/v1/files", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] { d->upload(req, res); });
  });
  http.Get("/v1/files", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] {
      int64_t limit = query_int(req, "limit", 10000, 1, 10000);
      std::optional<std::string> after;
      if (req.has_param("after")) after = req.get_param_value("after");
      std::string purpose = req.has_param("purpose") ? req.get_param_value("purpose") : "";
      json data = json::array();
      bool more = false;
      // One extra row tells whether there is a next page.
      std::vector<FileInfo> files = d->q().list_files(after, limit + 1);
      for (const FileInfo& f : files) {
        if (!purpose.empty() && f.purpose != purpose) continue;
        if (static_cast<int64_t>(data.size()) == limit) {
          more = true;
          break;
        }
        data.push_back(file_json(f));
      }
      send_json(res, {{"object", "list"},
                      {"data", data},
                      {"first_id", data.empty() ? json(nullptr) : data.front()["id"]},
                      {"last_id", data.empty() ? json(nullptr) : data.back()["id"]},
                      {"has_more", more}});
    });
  });
  http.Get(R"(/v1/files/([^/]+))", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] { send_json(res, file_json(d->file_or_404(req.matches[1]))); });
  });
  http.Get(R"(/v1/files/([^/]+)/content)", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] { d->file_content(req.matches[1], res); });
  });
  http.Delete(R"(/v1/files/([^/]+))", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] {
      const std::string id = req.matches[1];
      if (!d->q().delete_file(id)) throw ApiError(api_error(404, "No such File object: " + id, "file_id"));
      send_json(res, {{"id", id}, {"object", "file"}, {"deleted", true}});
    });
  });
  http.Post("/v1/batches", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] { d->create(req, res); });
  });
  http.Get("/v1/batches", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] {
      int64_t limit = query_int(req, "limit", 20, 1, 100);
      std::optional<std::string> after;
      if (req.has_param("after")) after = req.get_param_value("after");
      std::vector<BatchInfo> page = d->q().list_batches(after, limit + 1);
      bool more = static_cast<int64_t>(page.size()) > limit;
      if (more) page.resize(static_cast<size_t>(limit));
      json data = json::array();
      for (const BatchInfo& b : page) data.push_back(batch_json(b));
      send_json(res, {{"object", "list"},
                      {"data", data},
                      {"first_id", data.empty() ? json(nullptr) : data.front()["id"]},
                      {"last_id", data.empty() ? json(nullptr) : data.back()["id"]},
                      {"has_more", more}});
    });
  });
  http.Get(R"(/v1/batches/([^/]+))", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] { send_json(res, batch_json(d->batch_or_404(req.matches[1]))); });
  });
  http.Post(R"(/v1/batches/([^/]+)/cancel)", [d](const httplib::Request& req, httplib::Response& res) {
    d->guarded(res, [&] { d->cancel(req.matches[1], res); });
  });
}

}  // namespace corelm::serve
