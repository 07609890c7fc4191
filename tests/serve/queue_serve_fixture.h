// Shared set-up for the queue-backed server tests (test_queue_worker, test_generate_api): a tiny
// model folder, an in-process Server over a state dir, and bounded waits on the queue.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "corelm/queue.h"
#include "corelm/serve.h"
#include "serve/serve_fixture.h"

namespace corelm::testing {

// A Server on a free loopback port, serving on its own thread; shut down by the destructor.
class InProcessServer {
 public:
  explicit InProcessServer(serve::ServeOptions o) {
    o.port = 0;
    server_ = std::make_unique<serve::Server>(std::move(o));
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
    for (int i = 0; i < 1000 && !server_->ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~InProcessServer() {
    server_->shutdown();
    thread_.join();
  }
  int port() const { return port_; }
  serve::Server& server() { return *server_; }
  httplib::Client client(int read_timeout_s = 30) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(read_timeout_s, 0);
    return c;
  }
  std::pair<int, nlohmann::json> post(const std::string& path, const nlohmann::json& body) const {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, nullptr};
    return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
  }

 private:
  std::unique_ptr<serve::Server> server_;
  std::thread thread_;
  int port_ = -1;
};

// Polls `done` every 10 ms until it holds or `timeout_s` passes; returns its last value.
inline bool wait_for(const std::function<bool()>& done, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The value of a Prometheus sample line `name` (or `name{labels}`) in a /metrics text; -1 if absent.
inline double metric(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while ((pos = text.find(name + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + name.size() + 1));
    pos += name.size();
  }
  return -1;
}

}  // namespace corelm::testing
