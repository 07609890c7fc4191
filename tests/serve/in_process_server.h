// A serve::Server running in this process on a free loopback port, for tests that drive it with
// httplib::Client: start() binds, serves on its own thread and waits for /health; stop() shuts it
// down and joins. post_json / sse_payloads are the two request shapes the server tests send.
#pragma once
#include <httplib.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "corelm/serve.h"

namespace corelm::testing {

class InProcessServer {
 public:
  // Returns the bound port once /health answers 200 (or after ~10 s, leaving the tests to fail).
  int start(const serve::ServeOptions& options) {
    server_ = std::make_unique<serve::Server>(options);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 500; ++i) {
      auto r = c.Get("/health");
      if (r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return port_;
  }
  void stop() {
    if (server_) server_->shutdown();
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  ~InProcessServer() { stop(); }
  int port() const { return port_; }
  serve::Server& server() { return *server_; }

 private:
  std::unique_ptr<serve::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

inline httplib::Client loopback_client(int port, int read_timeout_s = 20) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(read_timeout_s, 0);
  return c;
}

// POST a JSON body: {HTTP status, parsed body} ({-1, null} when the request failed).
inline std::pair<int, nlohmann::json> post_json(int port, const std::string& path, const nlohmann::json& body,
                                                int read_timeout_s = 20) {
  auto c = loopback_client(port, read_timeout_s);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) return {-1, {}};
  return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
}

// The "data: " payloads of a streamed (SSE) response, [DONE] included; *status gets the HTTP status.
inline std::vector<std::string> sse_payloads(int port, const std::string& path, const nlohmann::json& body,
                                             int* status = nullptr, int read_timeout_s = 20) {
  auto c = loopback_client(port, read_timeout_s);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  std::vector<std::string> events;
  if (status) *status = r ? r->status : -1;
  if (!r) return events;
  std::string text = r->body;
  size_t pos = 0;
  while ((pos = text.find("data: ")) != std::string::npos) {
    const size_t end = text.find("\n\n", pos);
    events.push_back(text.substr(pos + 6, end - pos - 6));
    text = text.substr(end + 2);
  }
  return events;
}

}  // namespace corelm::testing
