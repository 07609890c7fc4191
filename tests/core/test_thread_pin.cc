// Opt-in core pinning of the thread pool: with it on, the caller and each worker run on one CPU
// of the process's allowed set (distinct while there are enough CPUs), results are unchanged, and
// turning it off gives the caller its whole allowed set back.
#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm {
namespace {

std::set<int> my_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(0, pthread_getaffinity_np(pthread_self(), sizeof(set), &set));
  std::set<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.insert(c);
  return out;
}

// Sum of i^2 over [0, n) in fixed chunks, each chunk into its own slot.
std::vector<double> chunk_sums(int64_t n) {
  std::vector<double> sums(static_cast<size_t>((n + 63) / 64));
  parallel_for(n, 64, [&](int64_t b, int64_t e) {
    double s = 0;
    for (int64_t i = b; i < e; ++i) s += static_cast<double>(i) * static_cast<double>(i) * 1e-3;
    sums[static_cast<size_t>(b / 64)] = s;
  });
  return sums;
}

TEST(ThreadPin, EachThreadRunsOnOneAllowedCpuAndResultsAreUnchanged) {
  if (std::getenv("CORELM_PIN_THREADS") == nullptr) {
    EXPECT_FALSE(pin_threads()) << "pinning is opt-in";
  }
  set_pin_threads(false);
  const std::set<int> allowed = my_cpus();
  ASSERT_FALSE(allowed.empty());
  set_num_threads(2);
  const std::vector<double> unpinned = chunk_sums(100000);

  set_pin_threads(true);
  EXPECT_TRUE(pin_threads());
  std::mutex mu;
  std::map<std::thread::id, std::set<int>> masks;
  // Small sleeping chunks so the worker certainly takes some of them.
  parallel_for(64, 1, [&](int64_t, int64_t) {
    std::set<int> m = my_cpus();
    const int now = sched_getcpu();
    {
      std::lock_guard<std::mutex> lk(mu);
      masks[std::this_thread::get_id()] = m;
      EXPECT_TRUE(m.count(now)) << "running on CPU " << now << " outside its mask";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  ASSERT_EQ(masks.size(), 2u) << "both the caller and the worker should have run chunks";
  std::set<int> used;
  for (const auto& [id, m] : masks) {
    ASSERT_EQ(m.size(), 1u) << "a pinned thread has a single-CPU mask";
    EXPECT_TRUE(allowed.count(*m.begin())) << "CPU " << *m.begin() << " is not in the allowed set";
    used.insert(*m.begin());
  }
  if (allowed.size() >= 2) {
    EXPECT_EQ(used.size(), 2u) << "threads share a CPU although two are allowed";
  }
  EXPECT_EQ(my_cpus(), std::set<int>{*allowed.begin()}) << "the caller takes the first allowed CPU";
  EXPECT_EQ(chunk_sums(100000), unpinned);

  set_pin_threads(false);
  EXPECT_FALSE(pin_threads());
  EXPECT_EQ(my_cpus(), allowed) << "turning pinning off restores the allowed set";
  EXPECT_EQ(chunk_sums(100000), unpinned);
  set_num_threads(1);
}

TEST(ThreadPin, MoreThreadsThanCpusWrapsAround) {
  const std::set<int> allowed = my_cpus();
  set_pin_threads(true);
  set_num_threads(static_cast<int>(allowed.size()) + 2);
  std::mutex mu;
  std::set<std::set<int>> masks;
  parallel_for(200, 1, [&](int64_t, int64_t) {
    std::set<int> m = my_cpus();
    std::lock_guard<std::mutex> lk(mu);
    masks.insert(m);
  });
  for (const auto& m : masks) {
    EXPECT_EQ(m.size(), 1u);
    EXPECT_TRUE(allowed.count(*m.begin()));
  }
  set_pin_threads(false);
  set_num_threads(1);
  EXPECT_EQ(my_cpus(), allowed);
}

}  // namespace
}  // namespace corelm
