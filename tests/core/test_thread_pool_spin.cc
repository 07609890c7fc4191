// The pool's spin-then-sleep hand-off: many back-to-back tiny jobs each run every chunk exactly
// once and never after parallel_for returned, exceptions and nested calls still work, resizing
// works right after a job, a bad CORELM_SPIN_US is refused, polling is off with fewer CPUs than
// threads, and an idle worker stops using CPU once its polling time has passed.
#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "corelm/error.h"
#include "corelm/thread_pool.h"

namespace corelm {
namespace {

// Sets CORELM_SPIN_US (nullopt: unset) for one test and restores the previous value after.
class SpinEnv {
 public:
  explicit SpinEnv(std::optional<std::string> value) {
    if (const char* old = std::getenv("CORELM_SPIN_US")) old_ = old;
    set(value);
  }
  ~SpinEnv() {
    set(old_);
    set_num_threads(1);
  }

 private:
  static void set(const std::optional<std::string>& v) {
    if (v)
      setenv("CORELM_SPIN_US", v->c_str(), 1);
    else
      unsetenv("CORELM_SPIN_US");
  }
  std::optional<std::string> old_;
};

// Rebuilds the pool so that it reads the environment again.
void restart_pool(int threads) {
  set_num_threads(1);
  set_num_threads(threads);
}

// Runs `calls` parallel_for calls of 2..9 one-item chunks; checks that every chunk ran exactly
// once and that no chunk of a call ran after that call returned.
void run_tiny_jobs(int calls) {
  std::atomic<int> current_call{-1};
  std::atomic<int> late_chunks{0};
  std::vector<std::atomic<int>> hits(9);
  for (int call = 0; call < calls; ++call) {
    const int64_t chunks = 2 + call % 8;
    current_call.store(call);
    parallel_for(chunks, 1, [&, call](int64_t b, int64_t) {
      if (current_call.load() != call) late_chunks++;
      hits[static_cast<size_t>(b)]++;
    });
    current_call.store(-1);
    for (int64_t c = 0; c < chunks; ++c)
      ASSERT_EQ(hits[static_cast<size_t>(c)].exchange(0), 1) << "call " << call << " chunk " << c;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(late_chunks.load(), 0) << "a worker ran a chunk after its parallel_for returned";
  for (auto& h : hits) EXPECT_EQ(h.load(), 0) << "a chunk ran after the checks";
}

TEST(ThreadPoolSpin, ManyTinyBackToBackJobsRunEachChunkOnce) {
  SpinEnv env(std::nullopt);
  for (int threads : {2, 3, 4}) {
    restart_pool(threads);
    run_tiny_jobs(threads == 2 ? 100000 : 20000);
  }
}

TEST(ThreadPoolSpin, ManyTinyJobsWithSpinningOff) {
  SpinEnv env(std::string("0"));
  restart_pool(2);
  EXPECT_EQ(thread_spin_microseconds(), 0);
  run_tiny_jobs(20000);
}

// Chunks long enough that the workers usually take some of them.
void sleepy_chunks(int64_t n, const std::function<void(int64_t)>& fn) {
  parallel_for(n, 1, [&](int64_t b, int64_t) {
    fn(b);
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  });
}

// Runs n one-item chunks so that both the caller and a worker run some: each side's first chunk
// waits (up to 2 s) until the other side has started one. Returns whether a worker ran one (false:
// no worker was woken).
bool with_a_worker(int64_t n, const std::function<void(int64_t)>& fn) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> caller_ran{false}, worker_ran{false};
  const auto wait_for = [](const std::atomic<bool>& flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!flag.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  };
  parallel_for(n, 1, [&](int64_t b, int64_t) {
    if (std::this_thread::get_id() == caller) {
      caller_ran.store(true);
      wait_for(worker_ran);
    } else {
      worker_ran.store(true);
      wait_for(caller_ran);
    }
    fn(b);
  });
  return worker_ran.load();
}

void exceptions_propagate_and_do_not_leak_into_the_next_job() {
  const std::thread::id caller = std::this_thread::get_id();
  for (int rep = 0; rep < 20; ++rep) {
    EXPECT_THROW(with_a_worker(16,
                               [&](int64_t) {
                                 if (std::this_thread::get_id() != caller) throw ValueError("worker chunk");
                               }),
                 ValueError);
    EXPECT_THROW(with_a_worker(16,
                               [&](int64_t) {
                                 if (std::this_thread::get_id() == caller) throw IndexError("caller chunk");
                               }),
                 IndexError);
    std::atomic<int64_t> total{0};
    parallel_for(100, 7, [&](int64_t b, int64_t e) { total += e - b; });  // no stale error rethrown
    EXPECT_EQ(total.load(), 100);
  }
}

TEST(ThreadPoolSpin, ExceptionsPropagateWithAndWithoutSpinning) {
  {
    SpinEnv env(std::nullopt);
    restart_pool(2);
    exceptions_propagate_and_do_not_leak_into_the_next_job();
  }
  {
    SpinEnv env(std::string("0"));
    restart_pool(2);
    exceptions_propagate_and_do_not_leak_into_the_next_job();
  }
}

TEST(ThreadPoolSpin, NestedCallsRunInlineOnTheSameThread) {
  SpinEnv env(std::nullopt);
  restart_pool(3);
  std::atomic<int> nested{0}, other_thread{0};
  sleepy_chunks(12, [&](int64_t) {
    const std::thread::id outer = std::this_thread::get_id();
    parallel_for(10, 1, [&](int64_t, int64_t) {
      nested++;
      if (std::this_thread::get_id() != outer) other_thread++;
    });
  });
  EXPECT_EQ(nested.load(), 120);
  EXPECT_EQ(other_thread.load(), 0);
}

TEST(ThreadPoolSpin, ResizeRightAfterJobsWhileWorkersPoll) {
  SpinEnv env(std::string("100000"));  // workers poll for 100 ms after each job
  for (int threads : {2, 4, 3, 2, 1, 2}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    std::atomic<int64_t> total{0};
    for (int rep = 0; rep < 100; ++rep) parallel_for(64, 1, [&](int64_t b, int64_t e) { total += e - b; });
    EXPECT_EQ(total.load(), 6400);
  }
}

TEST(ThreadPoolSpin, BadSpinValueIsRefusedAndLeavesThePoolAsItWas) {
  for (const char* bad : {"abc", "-1", "100001", "5us", " 7", "99999999999999999999"}) {
    SpinEnv env{std::string(bad)};
    set_num_threads(1);
    try {
      set_num_threads(2);
      ADD_FAILURE() << "CORELM_SPIN_US='" << bad << "' was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("CORELM_SPIN_US"), std::string::npos) << e.what();
    }
    EXPECT_EQ(num_threads(), 1);
    std::atomic<int> c{0};
    parallel_for(8, 1, [&](int64_t, int64_t) { c++; });
    EXPECT_EQ(c.load(), 8);
  }
}

TEST(ThreadPoolSpin, NoPollingWithFewerCpusThanThreads) {
  if (pin_threads()) GTEST_SKIP() << "CORELM_PIN_THREADS is set: pinned pools count the start-up CPU set";
  SpinEnv env(std::string("150"));
  cpu_set_t old_set;
  ASSERT_EQ(0, sched_getaffinity(0, sizeof(old_set), &old_set));
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  ASSERT_EQ(0, sched_setaffinity(0, sizeof(one), &one));
  restart_pool(2);
  EXPECT_EQ(thread_spin_microseconds(), 0) << "2 threads on 1 CPU must not poll";
  run_tiny_jobs(2000);
  ASSERT_EQ(0, sched_setaffinity(0, sizeof(old_set), &old_set));
  restart_pool(2);
  if (CPU_COUNT(&old_set) >= 2) {
    EXPECT_EQ(thread_spin_microseconds(), 150);
  }
  restart_pool(1);
  EXPECT_EQ(thread_spin_microseconds(), 0) << "1 thread has no workers to poll";
}

// CPU clock of a pool worker.
clockid_t worker_cpu_clock() {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> found{false};
  clockid_t clock{};
  EXPECT_TRUE(with_a_worker(8, [&](int64_t) {
    if (std::this_thread::get_id() != caller && !found.exchange(true)) {
      EXPECT_EQ(0, pthread_getcpuclockid(pthread_self(), &clock));
    }
  })) << "no chunk ran on a worker";
  return clock;
}

double cpu_ms(clockid_t clock) {
  timespec ts{};
  EXPECT_EQ(0, clock_gettime(clock, &ts));
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

TEST(ThreadPoolSpin, IdleWorkerStopsUsingCpu) {
  SpinEnv env(std::nullopt);
  restart_pool(2);
  const clockid_t clock = worker_cpu_clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // well past the polling time
  const double before = cpu_ms(clock);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(cpu_ms(clock) - before, 20.0) << "an idle worker kept running (polling forever?)";
}

// The measurement above can see a polling worker: with a 100 ms polling time it burns CPU right
// after a job, and then stops.
TEST(ThreadPoolSpin, PollingWorkerUsesCpuThenSleeps) {
  SpinEnv env(std::string("100000"));
  restart_pool(2);
  if (thread_spin_microseconds() == 0) GTEST_SKIP() << "fewer CPUs than threads: the pool does not poll";
  const clockid_t clock = worker_cpu_clock();
  const double start = cpu_ms(clock);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_GT(cpu_ms(clock) - start, 3.0) << "the worker did not poll after its job";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling time is over
  const double idle = cpu_ms(clock);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(cpu_ms(clock) - idle, 20.0) << "the worker kept polling past CORELM_SPIN_US";
}

}  // namespace
}  // namespace corelm
