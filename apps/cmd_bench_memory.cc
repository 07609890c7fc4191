// corelm bench memory: one-core read and copy bandwidth by working-set size (4 KiB .. 512 MiB), so
// the L1 / L2 / L3 / DRAM regimes show as steps -- the bandwidth ceilings of the GEMM roofline.
// Loads and stores are full vectors (zmm on AVX-512 machines, ymm on AVX2), chosen at run time;
// the functions carry their own target attribute, so this file stays baseline x86-64.
#include <time.h>

// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors, which -Wuninitialized
// reports once they are inlined (GCC bug 105593, a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/isa.h"

namespace corelm::cli {
namespace {

struct MemoryBenchArgs {
  bool json = false;
  double seconds = 0.05;  // per point
  int64_t max_mib = 512;
};

// The kernels run over n bytes (a multiple of 512) and return a value that depends on every
// load, so the compiler cannot drop them.
__attribute__((target("avx512f"))) float read_avx512(const float* p, size_t n) {
  // Eight independent sums: enough adds in flight for two 64-byte loads per cycle.
  __m512 acc[8];
  for (auto& x : acc) x = _mm512_setzero_ps();
  for (size_t i = 0; i < n / 4; i += 128)
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_load_ps(p + i + 16 * j));
  for (int j = 1; j < 8; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx512f"))) float copy_avx512(const float* src, float* dst, size_t n) {
  for (size_t i = 0; i < n / 4; i += 64) {
    _mm512_store_ps(dst + i, _mm512_load_ps(src + i));
    _mm512_store_ps(dst + i + 16, _mm512_load_ps(src + i + 16));
    _mm512_store_ps(dst + i + 32, _mm512_load_ps(src + i + 32));
    _mm512_store_ps(dst + i + 48, _mm512_load_ps(src + i + 48));
  }
  return dst[n / 8];
}

__attribute__((target("avx2"))) float read_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n / 4; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return lanes[0] + lanes[7];
}

__attribute__((target("avx2"))) float copy_avx2(const float* src, float* dst, size_t n) {
  for (size_t i = 0; i < n / 4; i += 32) {
    _mm256_store_ps(dst + i, _mm256_load_ps(src + i));
    _mm256_store_ps(dst + i + 8, _mm256_load_ps(src + i + 8));
    _mm256_store_ps(dst + i + 16, _mm256_load_ps(src + i + 16));
    _mm256_store_ps(dst + i + 24, _mm256_load_ps(src + i + 24));
  }
  return dst[n / 8];
}

float read_scalar(const float* p, size_t n) {
  float s = 0;
  for (size_t i = 0; i < n / 4; i += 16) s += p[i];  // one load per cache line
  return s;
}

float copy_scalar(const float* src, float* dst, size_t n) {
  std::memcpy(dst, src, n);
  return dst[n / 8];
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best seconds per pass: batches of passes (each batch >= 0.5 ms) repeated for `seconds` of this
// thread's CPU time (time the core spends on other processes does not count).
template <typename Fn>
double best_pass(double seconds, Fn fn) {
  volatile float sink = fn();
  double t0 = thread_cpu_seconds();
  sink = sink + fn();
  const double once = std::max(1e-9, thread_cpu_seconds() - t0);
  const int64_t reps = std::max<int64_t>(1, static_cast<int64_t>(5e-4 / once));
  double best = 1e30, spent = 0;
  do {
    t0 = thread_cpu_seconds();
    for (int64_t r = 0; r < reps; ++r) sink = sink + fn();
    const double dt = thread_cpu_seconds() - t0;
    spent += dt;
    best = std::min(best, dt / reps);
  } while (spent < seconds || spent < 3 * once);
  return best;
}

struct Buffer {
  float* p;
  explicit Buffer(size_t bytes) : p(static_cast<float*>(std::aligned_alloc(4096, bytes))) {
    CORELM_CHECK(p != nullptr, Error, "bench memory: cannot allocate ", bytes, " bytes");
    for (size_t i = 0; i < bytes / 4; ++i) p[i] = static_cast<float>(i & 1023) * 1e-3f;  // fault pages in
  }
  ~Buffer() { std::free(p); }
};

void run(const MemoryBenchArgs& a) {
  const Isa isa = active_isa();
  auto read = isa >= Isa::Avx512 ? read_avx512 : isa >= Isa::Avx2 ? read_avx2 : read_scalar;
  auto copy = isa >= Isa::Avx512 ? copy_avx512 : isa >= Isa::Avx2 ? copy_avx2 : copy_scalar;
  const size_t max_bytes = static_cast<size_t>(a.max_mib) << 20;
  Buffer src(max_bytes), dst(max_bytes / 2);
  nlohmann::ordered_json points = nlohmann::json::array();
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 2) {
    const double t_read = best_pass(a.seconds, [&] { return read(src.p, bytes); });
    // Copy: half the working set is read, half written; bandwidth counts both (as STREAM does).
    const double t_copy = best_pass(a.seconds, [&] { return copy(src.p, dst.p, bytes / 2); });
    points.push_back({{"bytes", bytes}, {"read_gb_s", bytes / t_read * 1e-9}, {"copy_gb_s", bytes / t_copy * 1e-9}});
  }
  nlohmann::ordered_json r{{"bench", "memory"},
                           {"isa", isa_name(isa)},
                           {"vector_bytes", isa >= Isa::Avx512 ? 64 : isa >= Isa::Avx2 ? 32 : 4},
                           {"threads", 1},
                           {"clock", "thread_cpu"},
                           {"copy_counts", "bytes read + bytes written"},
                           {"points", points}};
  if (a.json) {
    std::cout << r.dump() << "\n";
    return;
  }
  std::printf("isa %s, 1 thread; copy counts bytes read + written\n\n| working set | read GB/s | copy GB/s |\n"
              "|---|---|---|\n", isa_name(isa));
  for (const auto& p : points) {
    const size_t b = p["bytes"];
    const std::string size = b >= (1u << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
    std::printf("| %s | %.1f | %.1f |\n", size.c_str(), p["read_gb_s"].get<double>(), p["copy_gb_s"].get<double>());
  }
}

const RegisterCommand reg([](CLI::App& root) {
  CLI::App& bench = subcommand_group(root, "bench", "Benchmarks (JSON with --json)");
  auto* cmd = bench.add_subcommand("memory", "Read / copy bandwidth vs working-set size (L1 .. DRAM), one core");
  auto args = std::make_shared<MemoryBenchArgs>();
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  cmd->add_option("--seconds", args->seconds, "Measuring time per point")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-mib", args->max_mib, "Largest working set in MiB (a power of two)")->capture_default_str()
      ->check(CLI::Range(1, 16384));
  cmd->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
