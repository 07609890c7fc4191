#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "corelm/error.h"
#include "corelm/thread_pool.h"

using namespace corelm;

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
