// Sliding-window attention (ops::sliding_window_attention, the blocked kernel) against full causal
// attention (ops::causal_attention) at one training shape: forward + backward time per call and
// the probabilities each saves for its backward. One JSON object on stdout.
// Usage: sliding_attention_bench [T W Hq Hkv D reps]   (defaults 2048 256 2 1 32 20)
// Run pinned to one core, e.g. `taskset -c 0 build/release/bench/sliding_attention_bench`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/thread_pool.h"

namespace {

using corelm::Tensor;

struct Timing {
  double fwd_ms = 0, fwd_bwd_ms = 0;  // medians
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Median of `reps` timed calls after one warm-up: the forward alone (no gradient wanted) and the
// forward + backward with fresh leaves each time.
Timing time_op(const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& op, const Tensor& q,
               const Tensor& k, const Tensor& v, const Tensor& g, int reps) {
  std::vector<double> fwd, both;
  for (int r = 0; r <= reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    Tensor out = op(q, k, v);
    if (r > 0) fwd.push_back(ms_since(t0));
    Tensor ql = q.clone(), kl = k.clone(), vl = v.clone();
    ql.set_requires_grad(true);
    kl.set_requires_grad(true);
    vl.set_requires_grad(true);
    t0 = std::chrono::steady_clock::now();
    op(ql, kl, vl).backward(g);
    if (r > 0) both.push_back(ms_since(t0));
  }
  return {median(fwd), median(both)};
}

}  // namespace

int main(int argc, char** argv) {
  const auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const int64_t T = arg(1, 2048), W = arg(2, 256), Hq = arg(3, 2), Hkv = arg(4, 1), D = arg(5, 32);
  const int reps = static_cast<int>(arg(6, 20));
  corelm::set_num_threads(1);
  corelm::Generator gen(17);
  const Tensor q = Tensor::randn({1, Hq, T, D}, gen), k = Tensor::randn({1, Hkv, T, D}, gen),
               v = Tensor::randn({1, Hkv, T, D}, gen), g = Tensor::randn({1, Hq, T, D}, gen);

  const Timing swa = time_op(
      [W](const Tensor& a, const Tensor& b, const Tensor& c) { return corelm::ops::sliding_window_attention(a, b, c, W); },
      q, k, v, g, reps);
  const Timing causal = time_op(
      [](const Tensor& a, const Tensor& b, const Tensor& c) { return corelm::ops::causal_attention(a, b, c); }, q, k,
      v, g, reps);
  // Saved for the backward: the band [Hq, T, min(T, W + 64)] vs the full probabilities [Hq, T, T].
  const double band_mib = double(Hq * T * std::min<int64_t>(T, W + 64)) * 4 / (1 << 20);
  const double full_mib = double(Hq * T * T) * 4 / (1 << 20);
  std::printf(
      "{\"bench\": \"sliding_attention\", \"isa\": \"%s\", \"threads\": 1, \"B\": 1, \"T\": %lld, \"window\": %lld, "
      "\"Hq\": %lld, \"Hkv\": %lld, \"D\": %lld, \"reps\": %d,\n"
      " \"sliding\": {\"fwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"saved_probs_mib\": %.2f},\n"
      " \"causal\": {\"fwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"saved_probs_mib\": %.2f},\n"
      " \"speedup_fwd_bwd\": %.2f}\n",
      corelm::isa_name(corelm::active_isa()), (long long)T, (long long)W, (long long)Hq, (long long)Hkv, (long long)D,
      reps, swa.fwd_ms, swa.fwd_bwd_ms, band_mib, causal.fwd_ms, causal.fwd_bwd_ms, full_mib,
      causal.fwd_bwd_ms / swa.fwd_bwd_ms);
  return 0;
}
