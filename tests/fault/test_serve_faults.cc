// `corelm serve` under bad input and faults, against the real binary on a free loopback port:
// malformed bodies, wrong types, oversize bodies, unknown models, prompts over the context,
// invalid UTF-8, API keys, a full queue (429 + Retry-After, streaming too), a client gone
// mid-stream, slow-loris headers, kill -9 and restart, SIGTERM drain. Each test is bounded.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve/serve_fixture.h"

namespace corelm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::ServerProcess;

class ServeFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("corelm_serve_faults_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    testing::make_model_dir(root_ / "tiny");
    eos_ = testing::make_model_dir(root_ / "slow", testing::slow_shape(), 5);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string model(const char* name) { return (root_ / name).string(); }
  static fs::path log(const std::string& name) {
    return root_ / (::testing::UnitTest::GetInstance()->current_test_info()->name() + ("_" + name + ".log"));
  }
  static bool wait_healthy(int port, double timeout_s = 20) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(1, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }
  static httplib::Result post(int port, const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(20, 0);
    return c.Post(path.c_str(), h, body, "application/json");
  }
  // Waits until no slot is busy (per /metrics); false at the timeout.
  static bool wait_idle(int port, double timeout_s) {
    httplib::Client c("127.0.0.1", port);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = c.Get("/metrics");
      if (r && r->body.find("\ncorelm_slots_busy 0\n") != std::string::npos &&
          r->body.find("\ncorelm_queue_depth 0\n") != std::string::npos)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }
  static bool wait_metric(int port, const std::string& line, double timeout_s) {
    httplib::Client c("127.0.0.1", port);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = c.Get("/metrics");
      if (r && r->body.find(line) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  static std::string long_stream_body(int max_tokens) {
    json b = {{"model", "slow"}, {"prompt", "the cat"}, {"max_tokens", max_tokens}, {"stream", true}};
    if (eos_ >= 0) b["logit_bias"] = {{std::to_string(eos_), -100}};  // runs the whole max_tokens
    return b.dump();
  }

  static inline fs::path root_;
  static inline int eos_ = -1;
};

TEST_F(ServeFaults, BadInputGetsOpenAIErrors) {
  ServerProcess s({"--model", model("tiny"), "--max-body-bytes", "4096", "--api-key", "sekret"}, log("server"));
  const int port = s.wait_port();
  ASSERT_GT(port, 0) << s.log();
  ASSERT_TRUE(wait_healthy(port)) << s.log();  // /health is public
  const httplib::Headers key{{"Authorization", "Bearer sekret"}};
  auto expect = [&](const std::string& body, int status, const std::string& param, const httplib::Headers& h) {
    auto r = post(port, "/v1/completions", body, h);
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    for (const char* f : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(f)) << f;
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
  };
  expect(R"({"prompt":"x"})", 401, "", {});
  expect(R"({"prompt":"x"})", 401, "", {{"Authorization", "Bearer wrong"}});
  expect(R"({"prompt":"x"})", 401, "", {{"X-Api-Key", "sekre"}});
  expect("{\"prompt\": \"x\"", 400, "", key);                       // malformed JSON
  expect(R"({"prompt":"x","max_tokens":"5"})", 400, "max_tokens", key);  // wrong type
  expect(R"({"prompt":"x","stop":[1]})", 400, "stop[0]", key);
  expect(R"({"model":"nope","prompt":"x"})", 404, "model", key);
  expect("{\"prompt\":\"\xc3\x28\"}", 400, "", key);                // invalid UTF-8
  std::string longp;
  for (int i = 0; i < 150; ++i) longp += "the cat ";
  expect(json({{"prompt", longp}}).dump(), 400, "prompt", key);      // prompt over the context (96)
  expect(std::string(5000, ' ') + "{}", 413, "", key);               // body over --max-body-bytes
  // The good key, both spellings.
  auto ok = post(port, "/v1/completions", R"({"prompt":"the","max_tokens":2})", key);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto ok2 = post(port, "/v1/completions", R"({"prompt":"the","max_tokens":2})", {{"X-Api-Key", "sekret"}});
  ASSERT_TRUE(ok2);
  EXPECT_EQ(ok2->status, 200);
  httplib::Client c("127.0.0.1", port);
  auto nf = c.Get("/v1/nothing", key);
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(s.running());
}

TEST_F(ServeFaults, QueueFullIs429WithRetryAfter) {
  ServerProcess s({"--model", model("slow"), "--slots", "1", "--max-queue", "1"}, log("server"));
  const int port = s.wait_port();
  ASSERT_GT(port, 0) << s.log();
  ASSERT_TRUE(wait_healthy(port)) << s.log();
  // Two long streams hold the slot and the queue place; raw sockets so they can be dropped.
  int fds[2];
  for (int k = 0; k < 2; ++k) {
    int& fd = fds[k];
    fd = testing::connect_local(port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(testing::send_all(fd, testing::http_post_raw("/v1/completions", long_stream_body(3500))));
    // The response head (status 200) arrives once the request is queued.
    const std::string head = testing::recv_until(fd, "\r\n\r\n", 10);
    ASSERT_NE(head.find("200"), std::string::npos) << head;
    // The first must hold the slot before the second takes the queue place.
    if (k == 0) {
      ASSERT_TRUE(wait_metric(port, "\ncorelm_slots_busy 1\n", 10));
    }
  }
  for (bool stream : {false, true}) {
    json body = {{"model", "slow"}, {"prompt", "a"}, {"max_tokens", 2}, {"stream", stream}};
    auto r = post(port, "/v1/completions", body.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 429) << r->body;
    EXPECT_TRUE(r->has_header("Retry-After"));
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
  }
  for (int fd : fds) ::close(fd);
  EXPECT_TRUE(wait_idle(port, 10)) << "the dropped streams still hold the slot";
  auto r = post(port, "/v1/completions", R"({"prompt":"a","max_tokens":2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServeFaults, ClientGoneMidStreamFreesTheSlot) {
  ServerProcess s({"--model", model("slow"), "--slots", "2"}, log("server"));
  const int port = s.wait_port();
  ASSERT_GT(port, 0) << s.log();
  ASSERT_TRUE(wait_healthy(port)) << s.log();
  const int fd = testing::connect_local(port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::send_all(fd, testing::http_post_raw("/v1/completions", long_stream_body(3500))));
  const std::string got = testing::recv_until(fd, "\"text\"", 10);  // a first token arrived
  ASSERT_NE(got.find("data: "), std::string::npos) << got;
  ::close(fd);
  EXPECT_TRUE(wait_idle(port, 10)) << "the slot of the disconnected client was not freed";
  auto r = post(port, "/v1/completions", R"({"prompt":"a","max_tokens":3})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  httplib::Client c("127.0.0.1", port);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("corelm_requests_cancelled_total"), std::string::npos);
  EXPECT_TRUE(s.running());
}

TEST_F(ServeFaults, SlowLorisHeadersDoNotBlockOthersAndAreCut) {
  ServerProcess s({"--model", model("tiny"), "--read-timeout", "1", "--http-threads", "4"}, log("server"));
  const int port = s.wait_port();
  ASSERT_GT(port, 0) << s.log();
  ASSERT_TRUE(wait_healthy(port)) << s.log();
  // Three connections each send half a request head, one byte at a time, then stall.
  std::vector<int> slow;
  for (int i = 0; i < 3; ++i) {
    const int fd = testing::connect_local(port);
    ASSERT_GE(fd, 0);
    for (char ch : std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")) {
      ASSERT_TRUE(testing::send_all(fd, std::string(1, ch)));
    }
    slow.push_back(fd);
  }
  // Others are still served while those hang.
  const auto t0 = std::chrono::steady_clock::now();
  auto r = post(port, "/v1/completions", R"({"prompt":"the","max_tokens":2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  // And the stalled requests are cut after the read timeout (1 s): answered 400 or closed.
  for (int fd : slow) {
    bool closed = false;
    const std::string got = testing::recv_until(fd, "\r\n\r\n", 4, &closed);
    EXPECT_TRUE(closed || got.rfind("HTTP/1.1 400", 0) == 0) << "a stalled partial header was not cut: " << got;
    ::close(fd);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.0);
  EXPECT_TRUE(s.running());
}

TEST_F(ServeFaults, KillNineThenRestartServesTheSameModel) {
  auto hashes = [&] {
    std::map<std::string, std::string> h;
    for (const auto& e : fs::directory_iterator(root_ / "tiny")) h[e.path().filename().string()] = testing::read_text(e.path());
    return h;
  };
  const auto before = hashes();
  {
    ServerProcess s({"--model", model("tiny")}, log("first"));
    const int port = s.wait_port();
    ASSERT_GT(port, 0) << s.log();
    ASSERT_TRUE(wait_healthy(port));
    // kill -9 with a request in flight.
    std::thread t([&] { post(port, "/v1/completions", R"({"prompt":"the","max_tokens":60,"n":4})"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s.kill(SIGKILL);
    t.join();
  }
  EXPECT_EQ(hashes(), before) << "the model folder changed";
  ServerProcess s2({"--model", model("tiny")}, log("second"));
  const int port = s2.wait_port();
  ASSERT_GT(port, 0) << s2.log();
  ASSERT_TRUE(wait_healthy(port)) << s2.log();
  auto r = post(port, "/v1/completions", R"({"prompt":"the","max_tokens":4})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ServeFaults, SigtermDrainsInFlightRequestsAndExitsZero) {
  ServerProcess s({"--model", model("slow"), "--drain-seconds", "20"}, log("server"));
  const int port = s.wait_port();
  ASSERT_GT(port, 0) << s.log();
  ASSERT_TRUE(wait_healthy(port)) << s.log();
  const int fd = testing::connect_local(port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::send_all(fd, testing::http_post_raw("/v1/completions", long_stream_body(1500))));
  const std::string first = testing::recv_until(fd, "\"text\"", 10);
  ASSERT_NE(first.find("data: "), std::string::npos) << first;
  s.kill(SIGTERM);
  // New requests are refused while the in-flight one finishes.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto r = post(port, "/v1/completions", R"({"model":"slow","prompt":"a","max_tokens":2})");
  if (r) {
    EXPECT_EQ(r->status, 503) << r->body;  // (or the listener is already closed)
  }
  bool closed = false;
  const std::string rest = first + testing::recv_until(fd, "data: [DONE]", 20, &closed);
  ::close(fd);
  // Finished normally ("length", or "stop" should the model end first), not cancelled.
  EXPECT_TRUE(rest.find("\"finish_reason\":\"length\"") != std::string::npos ||
              rest.find("\"finish_reason\":\"stop\"") != std::string::npos) << rest.substr(rest.size() > 400 ? rest.size() - 400 : 0);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(s.wait_exit(25), 0) << s.log();
}


TEST_F(ServeFaults, BadOptionsFailWithOneClearLine) {
  using testing::run_corelm;
  struct Case {
    std::vector<std::string> args;
    const char* says;
  } cases[] = {
      {{"serve", "--port", "0"}, "--model"},
      {{"serve", "--model", (root_ / "missing").string(), "--port", "0"}, "no such model"},
      {{"serve", "--model", model("tiny"), "--port", "0", "--slots", "0"}, "--slots"},
      {{"serve", "--model", model("tiny"), "--port", "0", "--api-key", "a", "--api-key-file", "f"}, "at most one"},
      {{"serve", "--model", model("tiny"), "--port", "0", "--api-key-file", (root_ / "nokey").string()}, "API key file"},
      {{"serve", "--models-dir", (root_ / "tiny").string(), "--port", "0"}, "no models inside"},
      {{"serve", "--model", model("tiny"), "--model", model("tiny"), "--port", "0"}, "two models"},
  };
  for (const auto& c : cases) {
    auto r = run_corelm(c.args, {10});
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.all();
  }
  // The port in use: a clear error, not a hang.
  ServerProcess s({"--model", model("tiny")}, log("first"));
  const int port = s.wait_port();
  ASSERT_GT(port, 0) << s.log();
  auto r = run_corelm({"serve", "--model", model("tiny"), "--port", std::to_string(port)}, {10});
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("cannot listen"), std::string::npos) << r.all();
  // A key file works like --api-key.
  { std::ofstream(root_ / "key.txt") << "filekey\n"; }
  ServerProcess k({"--model", model("tiny"), "--api-key-file", (root_ / "key.txt").string()}, log("key"));
  const int kport = k.wait_port();
  ASSERT_GT(kport, 0) << k.log();
  ASSERT_TRUE(wait_healthy(kport));
  httplib::Client c("127.0.0.1", kport);
  auto no = c.Get("/v1/models");
  ASSERT_TRUE(no);
  EXPECT_EQ(no->status, 401);
  auto yes = c.Get("/v1/models", {{"X-Api-Key", "filekey"}});
  ASSERT_TRUE(yes);
  EXPECT_EQ(yes->status, 200);
}

}  // namespace
}  // namespace corelm
