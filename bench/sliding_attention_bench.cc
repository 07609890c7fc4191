// Sliding-window attention (ops::sliding_window_attention, the blocked kernel) against full causal
// attention (ops::causal_attention) at one training shape: forward + backward time per call and
// the probabilities each saves for its backward. One JSON object on stdout. Times are medians of
// the calling thread's CPU time (with one thread all the work runs there, and time the core gives
// to other processes on a shared machine is not counted) and, beside them, of wall time.
// Usage: sliding_attention_bench [T W Hq Hkv D reps]   (defaults 2048 256 2 1 32 20)
// Run pinned to one core, e.g. `taskset -c 0 build/release/bench/sliding_attention_bench`.
#include <algorithm>
#include <chrono>
#include <ctime>
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
  double fwd_ms = 0, fwd_bwd_ms = 0;            // medians of thread CPU time
  double fwd_wall_ms = 0, fwd_bwd_wall_ms = 0;  // medians of wall time
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Stamp {
  double cpu_ms, wall_ms;
};

Stamp now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  const double wall =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return {ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6, wall};
}

// Median of `reps` timed calls after one warm-up: the forward alone (no gradient wanted) and the
// forward + backward with fresh leaves each time.
Timing time_op(const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& op, const Tensor& q,
               const Tensor& k, const Tensor& v, const Tensor& g, int reps) {
  std::vector<double> fwd, both, fwd_wall, both_wall;
  for (int r = 0; r <= reps; ++r) {
    Stamp t0 = now();
    Tensor out = op(q, k, v);
    Stamp t1 = now();
    if (r > 0) fwd.push_back(t1.cpu_ms - t0.cpu_ms), fwd_wall.push_back(t1.wall_ms - t0.wall_ms);
    Tensor ql = q.clone(), kl = k.clone(), vl = v.clone();
    ql.set_requires_grad(true);
    kl.set_requires_grad(true);
    vl.set_requires_grad(true);
    t0 = now();
    op(ql, kl, vl).backward(g);
    t1 = now();
    if (r > 0) both.push_back(t1.cpu_ms - t0.cpu_ms), both_wall.push_back(t1.wall_ms - t0.wall_ms);
  }
  return {median(fwd), median(both), median(fwd_wall), median(both_wall)};
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
      " \"sliding\": {\"fwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"fwd_wall_ms\": %.3f, \"fwd_bwd_wall_ms\": %.3f, "
      "\"saved_probs_mib\": %.2f},\n"
      " \"causal\": {\"fwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"fwd_wall_ms\": %.3f, \"fwd_bwd_wall_ms\": %.3f, "
      "\"saved_probs_mib\": %.2f},\n"
      " \"speedup_fwd_bwd\": %.2f}\n",
      corelm::isa_name(corelm::active_isa()), (long long)T, (long long)W, (long long)Hq, (long long)Hkv, (long long)D,
      reps, swa.fwd_ms, swa.fwd_bwd_ms, swa.fwd_wall_ms, swa.fwd_bwd_wall_ms, band_mib, causal.fwd_ms,
      causal.fwd_bwd_ms, causal.fwd_wall_ms, causal.fwd_bwd_wall_ms, full_mib,
      causal.fwd_bwd_ms / swa.fwd_bwd_ms);
  return 0;
}
