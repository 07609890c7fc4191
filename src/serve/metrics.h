// Server counters for GET /metrics (Prometheus text format 0.0.4). Thread-safe.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace corelm::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double seconds);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex m_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); one more for +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void add_prompt_tokens(uint64_t n) { prompt_tokens_ += n; }
  void add_generated_token();
  double tokens_per_second() const;  // generated tokens over the last 10 s
  Histogram ttft, inter_token;
  // The scheduler gauges are summed over the loaded models by the server at scrape time.
  struct Gauges {
    int64_t queued = 0, running = 0, slots = 0, slots_busy = 0, kv_used = 0, kv_capacity = 0, loaded_models = 0;
    uint64_t prefix_hit_tokens = 0, cancelled = 0;
  };
  std::string render(const Gauges& g) const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<uint64_t> prompt_tokens_{0}, generated_tokens_{0};
  // Generated tokens per whole second, a ring of the last 11 seconds.
  std::chrono::steady_clock::time_point start_;
  std::vector<std::pair<int64_t, uint64_t>> ring_;
};

}  // namespace corelm::serve
