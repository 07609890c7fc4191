// corelm bench gemm: GFLOP/s of gemm_f32, the packed bf16 linear and the int8 and q4 linears (GOP/s) at
// fixed and model shapes, plus the three training products (X.W^T, dX = dY.W, dW = dY^T.X) in
// gemm_f32 and gemm_bf16, against the core's measured peaks (built-in FMA / vdpbf16ps / vpdpbusd
// probes) and, when the optional bench/onednn_gemm executable was built next to this binary,
// oneDNN in the same run.
#include <algorithm>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/isa.h"
#include "corelm/model.h"
#include "corelm/thread_pool.h"
// The kernel API is internal (src/); apps/ has no src/ include path, hence the relative path.
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_q4.h"

namespace corelm::cli {
namespace {

struct Shape3 {
  std::string name;
  int64_t M, K, N;
};

struct GemmBenchArgs {
  bool json = false;
  std::string shapes, preset = "tiny";
  double seconds = 0.3;
  int threads = 1;
};

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Seconds per call: the best of repeated short batches (each ~0.5 ms, so the clock's cost
// vanishes) over `seconds` in total. With one thread the batches are timed on this thread's CPU
// clock, so time the core gives to other processes (a shared machine) is not counted; with more
// threads, on the wall clock.
template <typename Fn>
double seconds_per_call(double seconds, bool cpu_clock, Fn fn) {
  using clock = std::chrono::steady_clock;
  auto now = [&] {
    return cpu_clock ? thread_cpu_seconds() : std::chrono::duration<double>(clock::now().time_since_epoch()).count();
  };
  fn();
  double t0 = now();
  fn();
  const double once = std::max(1e-9, now() - t0);
  const int64_t reps = std::max<int64_t>(1, static_cast<int64_t>(5e-4 / once));
  double best = 1e30, spent = 0;
  do {
    t0 = now();
    for (int64_t r = 0; r < reps; ++r) fn();
    const double dt = now() - t0;
    spent += dt;
    best = std::min(best, dt / reps);
  } while (spent < seconds);
  return best;
}

std::vector<float> filled(size_t n, float scale) {
  std::vector<float> v(n);
  uint32_t s = 12345;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return v;
}

std::vector<Shape3> default_shapes(const std::string& preset) {
  std::vector<Shape3> out = {{"amx_ref", 2048, 256, 1280}, {"square", 1024, 1024, 1024}};
  const model::ModelConfig c = model::ModelConfig::preset(preset);
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const std::vector<Shape3> layers = {{"q", 0, h, q},
                                      {"k/v", 0, h, kv},
                                      {"o", 0, q, h},
                                      {"gate/up", 0, h, c.intermediate_size},
                                      {"down", 0, c.intermediate_size, h},
                                      {"lm_head", 0, h, c.vocab_size}};
  for (const auto& l : layers)
    for (int64_t m : {1, 8, 16, 64, 256, 512}) out.push_back({preset + "." + l.name, m, l.K, l.N});
  return out;
}

std::vector<Shape3> parse_shapes(const std::string& text) {
  std::vector<Shape3> out;
  std::stringstream all(text);
  std::string item;
  while (std::getline(all, item, ';')) {
    if (item.empty()) continue;
    Shape3 s{"custom", 0, 0, 0};
    char c1 = 0, c2 = 0;
    std::stringstream one(item);
    CORELM_CHECK((one >> s.M >> c1 >> s.K >> c2 >> s.N) && c1 == ',' && c2 == ',' && one.eof() && s.M > 0 &&
                     s.K > 0 && s.N > 0,
                 ValueError, "--shapes: '", item, "' is not M,K,N with positive integers (e.g. 64,256,768)");
    out.push_back(s);
  }
  CORELM_CHECK(!out.empty(), ValueError, "--shapes: no shapes given");
  return out;
}

// oneDNN's figures for the same shapes, from bench/onednn_gemm if it was built (optional).
nlohmann::json run_onednn(const std::vector<Shape3>& shapes, double seconds) {
  const auto exe = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "bench" / "onednn_gemm";
  if (!std::filesystem::exists(exe)) return nullptr;
  std::string arg;
  for (const auto& s : shapes) arg += std::to_string(s.M) + "," + std::to_string(s.K) + "," + std::to_string(s.N) + ";";
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(num_threads()) + " " + exe.string() + " --shapes '" + arg + "' --seconds " + std::to_string(seconds);
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    if (pclose(p) != 0) return nlohmann::json{{"error", "onednn_gemm failed"}};
  }
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    return nlohmann::json{{"error", "onednn_gemm printed no JSON"}};
  }
}

void run(const GemmBenchArgs& a) {
  set_num_threads(a.threads);
  const bool cpu_clock = a.threads == 1;
  const auto shapes = a.shapes.empty() ? default_shapes(a.preset) : parse_shapes(a.shapes);
  const double fp32_peak = kernels::fp32_fma_peak_gflops(0.3), bf16_peak = kernels::bf16_dot_peak_gflops(0.3);
  const double int8_peak = kernels::int8_dot_peak_gops(0.3);
  const double amx_bf16_peak = kernels::amx_bf16_peak_gflops(0.3), amx_int8_peak = kernels::amx_int8_peak_gops(0.3);

  // Per-call floor: the cost of a 1x1x1 product, i.e. dispatch and call overhead alone.
  float one = 1.0f, out = 0.0f;
  const double gemm_floor = seconds_per_call(0.1, cpu_clock, [&] {
    kernels::gemm_f32(false, true, 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &out, 1);
  });
  const auto tiny_w = kernels::pack_linear_bf16(&one, 1, 1, 1, nullptr);
  const double linear_floor = seconds_per_call(0.1, cpu_clock, [&] { kernels::linear_bf16(&one, 1, 1, tiny_w, &out, 1); });
  const auto tiny_i8 = kernels::pack_linear_int8(&one, 1, 1, 1, nullptr);
  const double int8_floor = seconds_per_call(0.1, cpu_clock, [&] { kernels::linear_int8(&one, 1, 1, tiny_i8, &out, 1); });
  const auto tiny_q4 = kernels::pack_linear_q4(&one, 1, 1, 1, nullptr, kernels::preferred_q4_format());
  const double q4_floor = seconds_per_call(0.1, cpu_clock, [&] { kernels::linear_q4(&one, 1, 1, tiny_q4, &out, 1); });

  nlohmann::ordered_json results = nlohmann::json::array();
  for (const auto& s : shapes) {
    const auto X = filled(s.M * s.K, 1.0f), W = filled(s.N * s.K, 0.1f);
    std::vector<float> Y(s.M * s.N);
    const double flops = 2.0 * s.M * s.K * s.N;
    const double t_f32 = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::gemm_f32(false, true, s.M, s.N, s.K, 1.0f, X.data(), s.K, W.data(), s.K, 0.0f, Y.data(), s.N);
    });
    const auto packed = kernels::pack_linear_bf16(W.data(), s.N, s.K, s.K, nullptr);
    const double t_bf16 = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::linear_bf16(X.data(), s.M, s.K, packed, Y.data(), s.N);
    });
    const auto packed_i8 = kernels::pack_linear_int8(W.data(), s.N, s.K, s.K, nullptr);
    const double t_int8 = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::linear_int8(X.data(), s.M, s.K, packed_i8, Y.data(), s.N);
    });
    const auto packed_q4 = kernels::pack_linear_q4(W.data(), s.N, s.K, s.K, nullptr, kernels::preferred_q4_format());
    const double t_q4 = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::linear_q4(X.data(), s.M, s.K, packed_q4, Y.data(), s.N);
    });
    // The two backward products of training (dX = dY.W, dW = dY^T.X) and all three in gemm_bf16.
    const auto G = filled(s.M * s.N, 0.1f);
    std::vector<float> DX(s.M * s.K), DW(s.N * s.K);
    const double t_f32_dx = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::gemm_f32(false, false, s.M, s.K, s.N, 1.0f, G.data(), s.N, W.data(), s.K, 0.0f, DX.data(), s.K);
    });
    const double t_f32_dw = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::gemm_f32(true, false, s.N, s.K, s.M, 1.0f, G.data(), s.N, X.data(), s.K, 0.0f, DW.data(), s.K);
    });
    const double t_b16 = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::gemm_bf16(false, true, s.M, s.N, s.K, X.data(), s.K, W.data(), s.K, Y.data(), s.N);
    });
    const double t_b16_dx = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::gemm_bf16(false, false, s.M, s.K, s.N, G.data(), s.N, W.data(), s.K, DX.data(), s.K);
    });
    const double t_b16_dw = seconds_per_call(a.seconds, cpu_clock, [&] {
      kernels::gemm_bf16(true, false, s.N, s.K, s.M, G.data(), s.N, X.data(), s.K, DW.data(), s.K);
    });
    const double gemm_bf16_peak = bf16_peak > 0 ? bf16_peak : fp32_peak;
    auto pct = [](double g, double peak) { return peak > 0 ? 100 * g / peak : 0.0; };
    const double g_f32 = flops / t_f32 * 1e-9, g_bf16 = flops / t_bf16 * 1e-9, g_int8 = flops / t_int8 * 1e-9;
    // Each kernel is measured against the peak of the instruction it runs on.
    const double bf16_ref_peak = packed.isa == Isa::Amx ? amx_bf16_peak
                                 : packed.isa == Isa::Avx512Bf16 && bf16_peak > 0 ? bf16_peak
                                                                                  : fp32_peak;
    const double int8_ref_peak = packed_i8.isa == Isa::Amx ? amx_int8_peak : int8_peak;
    const double g_q4 = flops / t_q4 * 1e-9;  // q4 runs on vpdpbusd (VNNI) too: the same peak
    results.push_back({{"name", s.name},
                       {"M", s.M},
                       {"K", s.K},
                       {"N", s.N},
                       {"gemm_f32_gflops", g_f32},
                       {"gemm_f32_pct_peak", fp32_peak > 0 ? 100 * g_f32 / fp32_peak : 0.0},
                       {"gemm_f32_us", t_f32 * 1e6},
                       {"train_f32_dx_gflops", flops / t_f32_dx * 1e-9},
                       {"train_f32_dw_gflops", flops / t_f32_dw * 1e-9},
                       {"gemm_bf16_gflops", flops / t_b16 * 1e-9},
                       {"gemm_bf16_pct_peak", pct(flops / t_b16 * 1e-9, gemm_bf16_peak)},
                       {"gemm_bf16_dx_gflops", flops / t_b16_dx * 1e-9},
                       {"gemm_bf16_dw_gflops", flops / t_b16_dw * 1e-9},
                       {"gemm_bf16_dw_pct_peak", pct(flops / t_b16_dw * 1e-9, gemm_bf16_peak)},
                       {"linear_bf16_isa", isa_name(packed.isa)},
                       {"linear_bf16_gflops", g_bf16},
                       {"linear_bf16_pct_peak", bf16_ref_peak > 0 ? 100 * g_bf16 / bf16_ref_peak : 0.0},
                       {"linear_bf16_us", t_bf16 * 1e6},
                       {"weight_bytes_bf16", s.N * s.K * 2},
                       {"linear_int8_isa", isa_name(packed_i8.isa)},
                       {"linear_int8_gops", g_int8},
                       {"linear_int8_pct_peak", int8_ref_peak > 0 ? 100 * g_int8 / int8_ref_peak : 0.0},
                       {"linear_int8_us", t_int8 * 1e6},
                       {"weight_bytes_int8", static_cast<int64_t>(packed_i8.bytes())},
                       {"linear_q4_isa", isa_name(packed_q4.isa)},
                       {"linear_q4_format", kernels::q4_format_name(packed_q4.format)},
                       {"linear_q4_gops", g_q4},
                       {"linear_q4_pct_peak", packed_q4.isa == Isa::Avx512Bf16 ? pct(g_q4, int8_peak) : 0.0},
                       {"linear_q4_us", t_q4 * 1e6},
                       {"weight_bytes_q4", static_cast<int64_t>(packed_q4.bytes())}});
  }
  const nlohmann::json onednn = run_onednn(shapes, a.seconds);
  if (onednn.is_object() && onednn.contains("results"))
    for (size_t i = 0; i < results.size() && i < onednn["results"].size(); ++i) {
      const auto& d = onednn["results"][i];
      results[i]["onednn_f32_gflops"] = d.value("f32_gflops", 0.0);
      results[i]["onednn_bf16_gflops"] = d.value("bf16_gflops", 0.0);
    }

  nlohmann::ordered_json r{{"bench", "gemm"},
                           {"isa", isa_name(active_isa())},
                           {"threads", a.threads},
                           {"clock", cpu_clock ? "thread_cpu" : "wall"},
                           {"peak_fp32_gflops", fp32_peak},
                           {"peak_bf16_gflops", bf16_peak},
                           {"peak_int8_gops", int8_peak},
                           {"peak_amx_bf16_gflops", amx_bf16_peak},
                           {"peak_amx_int8_gops", amx_int8_peak},
                           {"call_floor_ns",
                            {{"gemm_f32", gemm_floor * 1e9}, {"linear_bf16", linear_floor * 1e9},
                             {"linear_int8", int8_floor * 1e9}, {"linear_q4", q4_floor * 1e9}}},
                           {"onednn", onednn.is_null() ? nlohmann::json("not built (bench/onednn_gemm)")
                                                       : onednn.value("version", nlohmann::json("error"))},
                           {"results", results}};
  if (a.json) {
    std::cout << r.dump() << "\n";
    return;
  }
  std::printf("isa %s, %d thread(s); peaks: fp32 FMA %.1f GFLOP/s, bf16 vdpbf16ps %.1f GFLOP/s, int8 vpdpbusd %.1f "
              "GOP/s\n", isa_name(active_isa()), a.threads, fp32_peak, bf16_peak, int8_peak);
  if (amx_bf16_peak > 0)
    std::printf("AMX tile peaks: tdpbf16ps %.1f GFLOP/s, tdpbusd %.1f GOP/s\n", amx_bf16_peak, amx_int8_peak);
  std::printf("per-call floor: gemm_f32 %.0f ns, linear_bf16 %.0f ns, linear_int8 %.0f ns, linear_q4 %.0f ns\n",
              gemm_floor * 1e9, linear_floor * 1e9, int8_floor * 1e9, q4_floor * 1e9);
  const bool dnn = results.size() && results[0].contains("onednn_bf16_gflops");
  std::printf("\n| shape | M | K | N | f32 GFLOP/s | %% fp32 peak | bf16 GFLOP/s | %% bf16 peak | int8 GOP/s | "
              "%% int8 peak | q4 GOP/s | train f32 X.W^T / dX / dW | train gemm_bf16 X.W^T / dX / dW |%s\n",
              dnn ? " oneDNN f32 | oneDNN bf16 |" : "");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n", dnn ? "---|---|" : "");
  for (const auto& x : results) {
    std::printf("| %s | %lld | %lld | %lld | %.1f | %.0f%% | %.1f | %.0f%% |", x["name"].get<std::string>().c_str(),
                static_cast<long long>(x["M"]), static_cast<long long>(x["K"]), static_cast<long long>(x["N"]),
                x["gemm_f32_gflops"].get<double>(), x["gemm_f32_pct_peak"].get<double>(),
                x["linear_bf16_gflops"].get<double>(), x["linear_bf16_pct_peak"].get<double>());
    std::printf(" %.1f | %.0f%% |", x["linear_int8_gops"].get<double>(), x["linear_int8_pct_peak"].get<double>());
    std::printf(" %.1f |", x["linear_q4_gops"].get<double>());
    std::printf(" %.0f / %.0f / %.0f | %.0f / %.0f / %.0f |", x["gemm_f32_gflops"].get<double>(),
                x["train_f32_dx_gflops"].get<double>(), x["train_f32_dw_gflops"].get<double>(),
                x["gemm_bf16_gflops"].get<double>(), x["gemm_bf16_dx_gflops"].get<double>(),
                x["gemm_bf16_dw_gflops"].get<double>());
    if (dnn) std::printf(" %.1f | %.1f |", x["onednn_f32_gflops"].get<double>(), x["onednn_bf16_gflops"].get<double>());
    std::printf("\n");
  }
}

const RegisterCommand reg([](CLI::App& root) {
  CLI::App& bench = subcommand_group(root, "bench", "Benchmarks (JSON with --json)");
  auto* cmd = bench.add_subcommand("gemm", "GEMM / packed bf16 / int8 linear GFLOP/s vs the measured peaks (and oneDNN)");
  auto args = std::make_shared<GemmBenchArgs>();
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  cmd->add_option("--shapes", args->shapes, "Shapes 'M,K,N;M,K,N;...' (default: fixed + model shapes)");
  cmd->add_option("--preset", args->preset, "Model preset whose layer shapes are measured")->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Measuring time per shape and path")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", args->threads, "Kernel threads")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
