#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <vector>

#include "common/process_limits.h"
#include "corelm/error.h"
#include "corelm/thread_pool.h"

using namespace corelm;

namespace {
using corelm::testing::kAddressSanitizer;
}  // namespace

TEST(ThreadPool, CoversRangeExactlyOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    for (int64_t n : {1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      parallel_for(n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1);
    }
  }
  set_num_threads(1);
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(100, 1, [](int64_t b, int64_t) {
                 if (b == 57) throw ValueError("chunk 57");
               }),
               ValueError);
  std::atomic<int64_t> total{0};
  parallel_for(100, 10, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 100);
  // Nested calls run inline rather than deadlock.
  std::atomic<int64_t> nested{0};
  parallel_for(4, 1, [&](int64_t, int64_t) { parallel_for(5, 1, [&](int64_t, int64_t) { nested++; }); });
  EXPECT_EQ(nested.load(), 20);
  set_num_threads(1);
  EXPECT_THROW(set_num_threads(0), ValueError);
}

TEST(ThreadPool, ManyShortJobs) {
  set_num_threads(2);
  for (int rep = 0; rep < 2000; ++rep) {
    std::atomic<int> c{0};
    parallel_for(4, 1, [&](int64_t, int64_t) { c++; });
    ASSERT_EQ(c.load(), 4);
  }
  set_num_threads(1);
}

// Issue 13, defect 16: --threads 100000 ended in "internal error: Resource temporarily
// unavailable" (std::system_error from std::thread). The count is bounded, and a thread the
// system will not start is a corelm::Error that leaves a working 1-thread pool.
TEST(ThreadPool, ThreadCountIsBounded) {
  EXPECT_THROW(set_num_threads(kMaxThreads + 1), ValueError);
  EXPECT_THROW(set_num_threads(100000), ValueError);
  EXPECT_THROW(set_num_threads(-3), ValueError);
  EXPECT_EQ(num_threads(), 1);
}

TEST(ThreadPool, ThreadsTheSystemRefusesAreAClearErrorAndThePoolStaysUsable) {
  if (kAddressSanitizer) GTEST_SKIP() << "RLIMIT_AS does not work under AddressSanitizer";
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Room for a few 8 MiB thread stacks, not for 64.
    size_t kb = 0;
    {
      std::ifstream in("/proc/self/status");
      std::string key;
      while (in >> key && key != "VmSize:") in.ignore(1 << 20, '\n');
      in >> kb;
    }
    rlimit r{static_cast<rlim_t>(kb * 1024 + (size_t{40} << 20)), static_cast<rlim_t>(kb * 1024 + (size_t{40} << 20))};
    ::setrlimit(RLIMIT_AS, &r);
    int rc = 0;
    try {
      set_num_threads(64);
      rc = 1;  // all 64 started: the limit did not bite
    } catch (const ValueError&) {
      rc = 2;
    } catch (const Error& e) {
      rc = std::string(e.what()).find("cannot start 64 compute threads") == std::string::npos ? 3 : 0;
    } catch (...) {
      rc = 4;  // the old std::system_error
    }
    if (rc == 0 && num_threads() != 1) rc = 5;
    std::atomic<int64_t> total{0};
    if (rc == 0) parallel_for(100, 10, [&](int64_t b, int64_t e) { total += e - b; });
    if (rc == 0 && total.load() != 100) rc = 6;
    ::_exit(rc);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << "signal " << WTERMSIG(st);
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: no failure to start; 3: unclear message; 4: not a corelm::Error; 5/6: pool broken";
}
