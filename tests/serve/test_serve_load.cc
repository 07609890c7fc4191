// A bounded load run against the real `corelm serve` binary on loopback: 64 concurrent streaming
// clients share a fixed set of requests (256 x 16 tokens) on a server with 8 slots, so the queue,
// admission, slot recycling and continuous batching all run at once (a watcher checks the gauges
// really showed a shared batch and a queue). Asserts no request fails, every stream is
// well-formed and ends with [DONE], every request got exactly its tokens, the metrics counters
// equal the totals, the slots are all idle afterwards, identical requests got identical text
// (batch invariance under load), and the server's peak RSS stays bounded. Throughput and latency
// figures belong to bench/serve_load.py, not here.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "serve/serve_fixture.h"

namespace corelm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::ServerProcess;

constexpr int kClients = 64;
constexpr int kRequests = 256;
constexpr int kTokens = 16;
constexpr int kPrompts = kRequests / 2;  // request i and i + kPrompts send the same body
constexpr int64_t kMaxHwmKiB = 1 << 20;  // 1 GiB: a tiny model; this only catches a runaway

struct Outcome {
  int status = -1;
  std::string error;  // why the response is not a good stream ("" when it is)
  std::string text;
  int64_t prompt_tokens = -1, completion_tokens = -1;
};

// Checks one SSE body: completion chunks with one id, then a usage chunk, then [DONE].
Outcome check_stream(int status, const std::string& body) {
  Outcome o;
  o.status = status;
  if (status != 200) {
    o.error = "status " + std::to_string(status) + ": " + body.substr(0, 300);
    return o;
  }
  std::vector<std::string> events;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      o.error = "an unterminated event";
      return o;
    }
    events.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  if (events.empty() || events.back() != "[DONE]") {
    o.error = "the stream does not end with [DONE]: " + body.substr(body.size() > 300 ? body.size() - 300 : 0);
    return o;
  }
  std::string id;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i], nullptr, false);
    if (!e.is_object() || !e.contains("id")) {
      o.error = "event " + std::to_string(i) + " is not a chunk: " + events[i];
      return o;
    }
    if (id.empty()) id = e["id"];
    if (e["id"] != id) {
      o.error = "chunk ids differ";
      return o;
    }
    if (e.contains("usage") && e["usage"].is_object()) {
      o.prompt_tokens = e["usage"]["prompt_tokens"];
      o.completion_tokens = e["usage"]["completion_tokens"];
    }
    for (const auto& c : e["choices"])
      if (c.contains("text") && c["text"].is_string()) o.text += c["text"].get<std::string>();
  }
  if (o.completion_tokens < 0) o.error = "no usage chunk";
  return o;
}

// The value of an unlabelled or labelled sample line "name value" in Prometheus text; -1 if absent.
double metric(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t p = text.find(key);
  if (p == std::string::npos) return -1;
  return std::stod(text.substr(p + key.size()));
}

int64_t vm_hwm_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

TEST(ServeLoad, SixtyFourStreamingClients) {
  const fs::path root = fs::temp_directory_path() / ("corelm_serve_load_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const int eos = testing::make_model_dir(root / "tiny");
  ServerProcess server({"--model", (root / "tiny").string(), "--slots", "8", "--max-queue", "128",
                        "--max-tokens-limit", "64"},
                       root / "serve.log");
  const int port = server.wait_port();
  ASSERT_GT(port, 0) << server.log();
  {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(1, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    bool up = false;
    while (!up && std::chrono::steady_clock::now() < deadline) {
      auto r = c.Get("/health");
      up = r && r->status == 200;
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(up) << server.log();
  }

  std::vector<std::string> bodies(kPrompts);
  std::mt19937 rng(2026);
  for (int i = 0; i < kPrompts; ++i) {
    json b = {{"model", "tiny"},
              {"prompt", testing::serve_words(rng, 2 + i % 7)},
              {"max_tokens", kTokens},
              {"temperature", 1.0},
              {"seed", 100 + i},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}};
    if (eos >= 0) b["logit_bias"] = {{std::to_string(eos), -100}};  // every request runs all kTokens
    bodies[static_cast<size_t>(i)] = b.dump();
  }

  std::vector<Outcome> out(kRequests);
  std::atomic<int> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  // A watcher samples the gauges during the run: the load must really batch and queue.
  std::atomic<bool> done{false};
  double max_busy = 0, max_queue = 0;
  std::thread watcher([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(5, 0);
    while (!done) {
      if (auto r = c.Get("/metrics")) {
        max_busy = std::max(max_busy, metric(r->body, "corelm_slots_busy"));
        max_queue = std::max(max_queue, metric(r->body, "corelm_queue_depth"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t)
    clients.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < kRequests;) {
        httplib::Client c("127.0.0.1", port);
        // httplib listens with a backlog of 5: a connect may wait for a SYN retry or two.
        c.set_connection_timeout(10, 0);
        c.set_read_timeout(20, 0);
        c.set_write_timeout(5, 0);
        auto r = c.Post("/v1/completions", bodies[static_cast<size_t>(i % kPrompts)], "application/json");
        if (!r) {
          out[static_cast<size_t>(i)].error = "transport error " + httplib::to_string(r.error());
          continue;
        }
        out[static_cast<size_t>(i)] = check_stream(r->status, r->body);
      }
    });
  for (auto& t : clients) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  watcher.join();
  std::cout << kRequests << " requests x " << kTokens << " tokens from " << kClients << " clients in " << seconds
            << " s; at most " << max_busy << " slots busy and " << max_queue << " requests queued" << std::endl;

  EXPECT_GE(max_busy, 2) << "the requests never shared a batch";
  EXPECT_GE(max_queue, 1) << "the clients never queued";

  int errors = 0;
  int64_t prompt_total = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Outcome& o = out[static_cast<size_t>(i)];
    if (!o.error.empty()) {
      if (++errors <= 5) ADD_FAILURE() << "request " << i << ": " << o.error;
      continue;
    }
    EXPECT_EQ(o.completion_tokens, kTokens) << "request " << i;
    EXPECT_GT(o.prompt_tokens, 0) << "request " << i;
    prompt_total += o.prompt_tokens;
  }
  ASSERT_EQ(errors, 0);
  for (int i = 0; i < kPrompts; ++i) {
    const Outcome &a = out[static_cast<size_t>(i)], &b = out[static_cast<size_t>(i + kPrompts)];
    EXPECT_EQ(a.text, b.text) << "request " << i << " and its twin " << i + kPrompts << " (same body) differ";
    EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  }

  // The last token's callback may run just after the client read [DONE]: poll for idle.
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5, 0);
  std::string metrics;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = c.Get("/metrics");
    ASSERT_TRUE(r);
    metrics = r->body;
    if (metric(metrics, "corelm_slots_busy") == 0 && metric(metrics, "corelm_queue_depth") == 0 &&
        metric(metrics, "corelm_requests_running") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metric(metrics, "corelm_slots_busy"), 0) << metrics;
  EXPECT_EQ(metric(metrics, "corelm_queue_depth"), 0);
  EXPECT_EQ(metric(metrics, "corelm_requests_running"), 0);
  EXPECT_EQ(metric(metrics, "corelm_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"), kRequests)
      << metrics;
  EXPECT_EQ(metrics.find("endpoint=\"/v1/completions\",status=\"4"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("endpoint=\"/v1/completions\",status=\"5"), std::string::npos) << metrics;
  EXPECT_EQ(metric(metrics, "corelm_generated_tokens_total"), kRequests * kTokens);
  EXPECT_EQ(metric(metrics, "corelm_prompt_tokens_total"), static_cast<double>(prompt_total));
  EXPECT_EQ(metric(metrics, "corelm_requests_cancelled_total"), 0);
  EXPECT_EQ(metric(metrics, "corelm_time_to_first_token_seconds_count"), kRequests);
  EXPECT_EQ(metric(metrics, "corelm_inter_token_latency_seconds_count"), kRequests * (kTokens - 1));

  auto slots = c.Get("/slots");
  ASSERT_TRUE(slots);
  const json sj = json::parse(slots->body, nullptr, false);
  ASSERT_TRUE(sj.is_array()) << slots->body;
  EXPECT_EQ(sj.size(), 8u) << slots->body;
  for (const auto& s : sj) EXPECT_EQ(s["state"], "idle") << slots->body;

  const int64_t hwm = vm_hwm_kib(server.pid());
  std::cout << "server VmHWM " << hwm << " KiB" << std::endl;
  EXPECT_GT(hwm, 0);
  EXPECT_LT(hwm, kMaxHwmKiB);
  server.kill(SIGKILL);
  fs::remove_all(root);
}

}  // namespace
}  // namespace corelm
