// corelm bench allreduce: latency and bandwidth of the fp32 sum all-reduce that data-parallel
// training runs on its gradient buckets, by message size (4 KiB .. 64 MiB), blocking
// (MPI_Allreduce) and non-blocking (MPI_Iallreduce + wait). Run it under the launcher and
// placement training will use (`mpirun -np 2 --bind-to core corelm bench allreduce`): the bucket
// size `corelm train --bucket-kb` defaults to is the smallest message that reaches most of the
// bandwidth, so a bucket costs little more than its bytes while backward still overlaps it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/mpi.h"

namespace corelm::cli {
namespace {

struct AllreduceBenchArgs {
  bool json = false, mpi = false;
  double seconds = 0.2;  // per point and mode
  int64_t min_kib = 4, max_mib = 64;
  double good_fraction = 0.8;  // "most of the bandwidth" for the suggested bucket size
};

using Clock = std::chrono::steady_clock;

// Seconds per operation: the mean over a round of repetitions, the best of kRounds rounds (a
// round that another process's time slice interrupted says nothing about the transport), and of
// that the slowest rank's (a collective ends when its last rank does). Every rank runs the same
// number of repetitions: the largest any rank asked for.
constexpr int kRounds = 5;
template <typename Op>
double time_op(const dist::World& world, double seconds, Op op) {
  op();  // warm-up: connections, buffers paged in
  world.barrier();
  auto t0 = Clock::now();
  op();
  const double once = std::max(1e-7, std::chrono::duration<double>(Clock::now() - t0).count());
  int64_t reps = std::clamp<int64_t>(static_cast<int64_t>(seconds / kRounds / once), 2, 100000);
  world.allreduce_max(&reps, 1);
  double best = 1e30;
  for (int round = 0; round < kRounds; ++round) {
    world.barrier();
    t0 = Clock::now();
    for (int64_t r = 0; r < reps; ++r) op();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(reps));
  }
  const std::vector<double> all = world.gather({best});  // empty except at rank 0, which prints
  return all.empty() ? best : *std::max_element(all.begin(), all.end());
}

void run(const AllreduceBenchArgs& a) {
  dist::World world(a.mpi);
  CORELM_CHECK(world.size() >= 2, ValueError,
               "bench allreduce: needs at least 2 MPI ranks (e.g. mpirun -np 2 --bind-to core corelm bench allreduce)");
  CORELM_CHECK(a.min_kib >= 1 && a.max_mib >= 1 && (a.min_kib << 10) <= (a.max_mib << 20), ValueError,
               "bench allreduce: --min-kib must be at most --max-mib");
  const size_t max_bytes = static_cast<size_t>(a.max_mib) << 20;
  std::vector<float> buf(max_bytes / sizeof(float), 0.0f);  // zeros: the sums stay zero (no inf/denormals)
  nlohmann::ordered_json points = nlohmann::json::array();
  const double n = world.size();
  double best_bw = 0;
  for (size_t bytes = static_cast<size_t>(a.min_kib) << 10; bytes <= max_bytes; bytes *= 2) {
    const size_t count = bytes / sizeof(float);
    const double t_block = time_op(world, a.seconds, [&] { world.allreduce_sum(buf.data(), count); });
    const double t_nb = time_op(world, a.seconds, [&] { world.iallreduce_sum(buf.data(), count).wait(); });
    const double algbw = static_cast<double>(bytes) / t_block * 1e-9;
    best_bw = std::max(best_bw, algbw);
    // Bus bandwidth (the NCCL-tests convention): each rank sends and receives 2 (n - 1) / n of the
    // message in a ring all-reduce, so this figure is comparable across rank counts.
    points.push_back({{"bytes", bytes},
                      {"latency_us", t_block * 1e6},
                      {"iallreduce_us", t_nb * 1e6},
                      {"algbw_gb_s", algbw},
                      {"busbw_gb_s", algbw * 2 * (n - 1) / n}});
  }
  size_t suggested = 0;
  for (const auto& p : points)
    if (p["algbw_gb_s"].get<double>() >= a.good_fraction * best_bw) {
      suggested = p["bytes"].get<size_t>();
      break;
    }
  if (!world.is_root()) return;
  nlohmann::ordered_json r{{"bench", "allreduce"},
                           {"ranks", world.size()},
                           {"dtype", "f32"},
                           {"op", "sum"},
                           {"clock", "wall, best of 5 rounds, slowest rank"},
                           {"points", points},
                           {"best_algbw_gb_s", best_bw},
                           {"good_fraction", a.good_fraction},
                           {"suggested_bucket_bytes", suggested}};
  if (a.json) {
    std::cout << r.dump() << "\n";
    return;
  }
  std::printf("%d ranks, f32 sum; best of 5 rounds, time of the slowest rank\n\n| message | latency us | iallreduce+wait us | algbw GB/s | "
              "busbw GB/s |\n|---|---|---|---|---|\n",
              world.size());
  for (const auto& p : points) {
    const size_t b = p["bytes"];
    const std::string size = b >= (1u << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
    std::printf("| %s | %.1f | %.1f | %.2f | %.2f |\n", size.c_str(), p["latency_us"].get<double>(),
                p["iallreduce_us"].get<double>(), p["algbw_gb_s"].get<double>(), p["busbw_gb_s"].get<double>());
  }
  std::printf("\nsmallest message at >= %.0f%% of the best bandwidth: %zu KiB (corelm train --bucket-kb)\n",
              a.good_fraction * 100, suggested >> 10);
}

const RegisterCommand reg([](CLI::App& root) {
  CLI::App& bench = subcommand_group(root, "bench", "Benchmarks (JSON with --json)");
  auto* cmd = bench.add_subcommand("allreduce",
                                   "MPI all-reduce latency and bandwidth vs message size (run under mpirun -np N)");
  auto args = std::make_shared<AllreduceBenchArgs>();
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  cmd->add_flag("--mpi", args->mpi, "initialise MPI even when no launcher's environment is seen");
  cmd->add_option("--seconds", args->seconds, "Measuring time per point and mode")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--min-kib", args->min_kib, "Smallest message in KiB")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-mib", args->max_mib, "Largest message in MiB")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--good-fraction", args->good_fraction,
                  "Fraction of the best bandwidth the suggested bucket size must reach")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  cmd->callback([args] { run(*args); });
});

}  // namespace
}  // namespace corelm::cli
