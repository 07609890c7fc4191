// corelm bench linear-attention: log-decay linear attention (ops::linear_attention) on one shape:
// the chunked parallel form (the default ISA path) against the per-token reference recurrence
// (CORELM_ISA=reference path), forward alone and forward + backward, and the recurrent decode step
// token by token (ops/linear_attention_step.h). Tokens/s = B · T / seconds of the fastest run.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/autograd.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/thread_pool.h"
#include "ops/linear_attention_step.h"

namespace corelm::cli {
namespace {

struct LinearAttentionBenchArgs {
  int64_t batch = 1, q_heads = 2, kv_heads = 1, state_dim = 32, value_dim = 32, seq_len = 2048;
  int threads = 1;
  double seconds = 1.0;
  bool json = false;
};

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Fastest of the runs of fn over at least `min_seconds` of wall time (and at least 3 runs). With
// one thread each run is timed on the thread's CPU clock (as `bench gemm` does), so time the core
// gives to other processes on a shared machine is not counted; with more, on the wall clock.
template <typename Fn>
double best_seconds(double min_seconds, bool cpu_clock, Fn fn) {
  using clock = std::chrono::steady_clock;
  double best = 1e30, total = 0;
  for (int runs = 0; runs < 3 || total < min_seconds; ++runs) {
    const auto t0 = clock::now();
    const double c0 = thread_cpu_seconds();
    fn();
    const double wall = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, cpu_clock ? thread_cpu_seconds() - c0 : wall);
    total += wall;
  }
  return best;
}

void run(const LinearAttentionBenchArgs& a) {
  set_num_threads(a.threads);
  const bool cpu_clock = a.threads == 1;
  Generator gen(1);
  const int64_t B = a.batch, Hq = a.q_heads, Hkv = a.kv_heads, T = a.seq_len, ds = a.state_dim, dv = a.value_dim;
  const Tensor q = Tensor::randn({B, Hq, T, ds}, gen, 0.2f), k = Tensor::randn({B, Hkv, T, ds}, gen, 0.2f);
  const Tensor v = Tensor::randn({B, Hkv, T, dv}, gen), go = Tensor::randn({B, Hq, T, dv}, gen);
  const Tensor log_decay = Tensor::rand({Hkv, ds}, gen, -4.0f, -0.001f);

  auto forward = [&] {
    autograd::NoGradGuard no_grad;
    return ops::linear_attention(q, k, v, log_decay);
  };
  auto forward_backward = [&] {
    Tensor ql = q.clone(), kl = k.clone(), vl = v.clone(), al = log_decay.clone();
    for (Tensor* t : {&ql, &kl, &vl, &al}) t->set_requires_grad(true);
    ops::linear_attention(ql, kl, vl, al).backward(go);
  };
  const Isa fast_isa = active_isa();
  const double chunked_fwd = best_seconds(a.seconds, cpu_clock, forward);
  const double chunked_fb = best_seconds(a.seconds, cpu_clock, forward_backward);
  double reference_fwd, reference_fb;
  {
    ScopedIsa reference(Isa::Reference);
    reference_fwd = best_seconds(a.seconds, cpu_clock, forward);
    reference_fb = best_seconds(a.seconds, cpu_clock, forward_backward);
  }
  // Decode: one sequence (row 0), token by token from a zero state, inputs gathered per token as
  // a decoder would hold them ([H, d] rows).
  const Tensor decay = ops::linear_attention_decay(log_decay);
  const ops::LinearAttentionStepShape shape{Hq, Hkv, ds, dv};
  const Tensor qt = q.slice(0, 0, 1).reshape({Hq, T, ds}).transpose(0, 1).contiguous();
  const Tensor kt = k.slice(0, 0, 1).reshape({Hkv, T, ds}).transpose(0, 1).contiguous();
  const Tensor vt = v.slice(0, 0, 1).reshape({Hkv, T, dv}).transpose(0, 1).contiguous();
  Tensor state = Tensor::zeros({Hkv, ds, dv}), out = Tensor::empty({Hq, dv});
  const double decode = best_seconds(a.seconds, cpu_clock, [&] {
    for (int64_t t = 0; t < T; ++t)
      ops::linear_attention_step(state.data<float>(), qt.data<float>() + t * Hq * ds, kt.data<float>() + t * Hkv * ds,
                                 vt.data<float>() + t * Hkv * dv, decay.data<float>(), out.data<float>(), shape);
  });

  const double tokens = static_cast<double>(B * T);
  nlohmann::ordered_json r{{"op", "linear_attention"},
                           {"batch", B}, {"q_heads", Hq}, {"kv_heads", Hkv}, {"state_dim", ds}, {"value_dim", dv},
                           {"seq_len", T}, {"threads", a.threads}, {"fast_isa", isa_name(fast_isa)},
                           {"clock", cpu_clock ? "thread_cpu" : "wall"},
                           {"chunked_forward_ms", chunked_fwd * 1e3},
                           {"chunked_forward_backward_ms", chunked_fb * 1e3},
                           {"reference_forward_ms", reference_fwd * 1e3},
                           {"reference_forward_backward_ms", reference_fb * 1e3},
                           {"chunked_train_tokens_per_s", tokens / chunked_fb},
                           {"reference_train_tokens_per_s", tokens / reference_fb},
                           {"decode_step_us", decode / T * 1e6},
                           {"decode_tokens_per_s", T / decode}};
  if (a.json) {
    std::cout << r.dump() << "\n";
  } else {
    std::printf("linear attention B=%lld Hq=%lld Hkv=%lld d_s=%lld d_v=%lld T=%lld, %d thread(s)\n"
                "  chunked (%s):  forward %.3f ms, forward+backward %.3f ms (%.0f tokens/s)\n"
                "  reference:     forward %.3f ms, forward+backward %.3f ms (%.0f tokens/s)\n"
                "  decode step:   %.3f us/token (%.0f tokens/s)\n",
                static_cast<long long>(B), static_cast<long long>(Hq), static_cast<long long>(Hkv),
                static_cast<long long>(ds), static_cast<long long>(dv), static_cast<long long>(T), a.threads,
                isa_name(fast_isa), chunked_fwd * 1e3, chunked_fb * 1e3, tokens / chunked_fb, reference_fwd * 1e3,
                reference_fb * 1e3, tokens / reference_fb, decode / T * 1e6, T / decode);
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto args = std::make_shared<LinearAttentionBenchArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "Benchmarks (JSON with --json)");
  CLI::App* c = bench.add_subcommand("linear-attention",
                                     "Log-decay linear attention: chunked vs reference forward+backward, decode step");
  c->add_option("--batch", args->batch, "batch rows")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--q-heads", args->q_heads, "query heads")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--kv-heads", args->kv_heads, "kv heads (divides --q-heads)")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--state-dim", args->state_dim, "d_s")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--value-dim", args->value_dim, "d_v")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--seq-len", args->seq_len, "T")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--threads", args->threads, "thread count")->capture_default_str();
  c->add_option("--seconds", args->seconds, "minimum measuring time per figure")->capture_default_str();
  c->add_flag("--json", args->json, "print one JSON object");
  c->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
