#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>

namespace corelm::serve {

namespace {
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double seconds) {
  std::lock_guard<std::mutex> lock(m_);
  size_t i = 0;
  while (i < bounds_.size() && seconds > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += seconds;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(m_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      inter_token({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      start_(std::chrono::steady_clock::now()),
      ring_(11, {-1, 0}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(m_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_generated_token() {
  ++generated_tokens_;
  const int64_t sec =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(m_);
  auto& slot = ring_[static_cast<size_t>(sec) % ring_.size()];
  if (slot.first != sec) slot = {sec, 0};
  ++slot.second;
}

double Metrics::tokens_per_second() const {
  const int64_t sec =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(m_);
  uint64_t total = 0;
  // The 10 whole seconds before the current (partial) one.
  for (const auto& [s, n] : ring_)
    if (s >= sec - 10 && s < sec) total += n;
  const int64_t span = std::min<int64_t>(10, std::max<int64_t>(1, sec));
  return static_cast<double>(total) / static_cast<double>(span);
}

std::string Metrics::render(const Gauges& g) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(m_);
    out += "# HELP corelm_requests_total HTTP requests answered, by endpoint and status.\n"
           "# TYPE corelm_requests_total counter\n";
    for (const auto& [key, n] : requests_)
      out += "corelm_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
             std::to_string(n) + "\n";
  }
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " +
           std::to_string(v) + "\n";
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + num(v) + "\n";
  };
  counter("corelm_prompt_tokens_total", "Prompt tokens submitted to the schedulers.", prompt_tokens_.load());
  counter("corelm_generated_tokens_total", "Tokens generated.", generated_tokens_.load());
  counter("corelm_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", g.prefix_hit_tokens);
  counter("corelm_requests_cancelled_total", "Scheduler requests cancelled (client gone, drain).", g.cancelled);
  gauge("corelm_tokens_per_second", "Generated tokens per second over the last 10 s.", tokens_per_second());
  gauge("corelm_queue_depth", "Requests waiting for a slot (all models).", static_cast<double>(g.queued));
  gauge("corelm_requests_running", "Requests holding at least one slot (all models).", static_cast<double>(g.running));
  gauge("corelm_slots", "Scheduler slots (all loaded models).", static_cast<double>(g.slots));
  gauge("corelm_slots_busy", "Scheduler slots in use (all loaded models).", static_cast<double>(g.slots_busy));
  gauge("corelm_kv_tokens_used", "KV cache positions held (all loaded models).", static_cast<double>(g.kv_used));
  gauge("corelm_kv_tokens_capacity", "KV cache positions available (all loaded models).", static_cast<double>(g.kv_capacity));
  gauge("corelm_kv_usage_ratio", "kv_tokens_used / kv_tokens_capacity.",
        g.kv_capacity > 0 ? static_cast<double>(g.kv_used) / static_cast<double>(g.kv_capacity) : 0.0);
  gauge("corelm_models_loaded", "Models loaded now.", static_cast<double>(g.loaded_models));
  ttft.render(out, "corelm_time_to_first_token_seconds", "From request arrival to its first generated token.");
  inter_token.render(out, "corelm_inter_token_latency_seconds", "Between consecutive tokens of one sequence.");
  return out;
}

}  // namespace corelm::serve
