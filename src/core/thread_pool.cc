#include "corelm/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "corelm/error.h"

namespace corelm {

namespace {

// The process's allowed CPUs, read once before this file pins any thread (a pinned thread's own
// mask would hide the rest).
// Never destroyed: the pool's destructor runs during static destruction too.
const std::vector<int>& allowed_cpus() {
  static const std::vector<int>& cpus = *new std::vector<int>([] {
    std::vector<int> out;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
  }());
  return cpus;
}

// CPUs the calling thread may run on right now (taskset can shrink it after allowed_cpus() was read).
int current_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

void warn_once(const char* what) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fprintf(stderr, "corelm: warning: could not %s (thread pinning left as is): %s\n", what, std::strerror(errno));
}

// Pins the calling thread to the slot-th allowed CPU (wrapping); slot < 0: back to the whole set.
void pin_self(int slot) {
  const std::vector<int>& cpus = allowed_cpus();
  if (cpus.empty()) {
    warn_once("read the allowed CPU set");
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (slot < 0)
    for (int c : cpus) CPU_SET(c, &set);
  else
    CPU_SET(cpus[static_cast<size_t>(slot) % cpus.size()], &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    errno = rc;
    warn_once("set a thread's CPU affinity");
  }
}

bool pin_from_env() {
  const char* v = std::getenv("CORELM_PIN_THREADS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// How long a thread keeps polling for the next hand-off before it sleeps. A decode step of the
// tiny preset issues ~25 parallel_for calls of 5-50 us each; measured on the 2-core VM, 95% of the
// gaps between them are under 20 us and 99% under 50 us, while a futex wake-up costs about as much
// as such a job. 20-300 us all gave the same decode speed there; 50 keeps the CPU burnt by an
// idle-bound worker small.
constexpr int kDefaultSpinUs = 50;
constexpr int kMaxSpinUs = 100000;

int spin_us_from_env() {
  const char* v = std::getenv("CORELM_SPIN_US");
  if (v == nullptr || *v == '\0') return kDefaultSpinUs;
  char* end = nullptr;
  errno = 0;
  const long us = std::strtol(v, &end, 10);
  CORELM_CHECK(*v >= '0' && *v <= '9' && errno == 0 && *end == '\0' && us >= 0 && us <= kMaxSpinUs, ValueError,
               "CORELM_SPIN_US must be an integer number of microseconds in [0, ", kMaxSpinUs, "], got '", v,
               "'");
  return static_cast<int>(us);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Polls ready() until it holds or spin_us of wall time pass; true when it held.
template <typename Ready>
bool spin_until(int spin_us, Ready ready) {
  if (spin_us <= 0) return ready();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

// Workers wait for a job, then pull chunk indices from a shared counter until none are left. The
// caller's thread pulls chunks too, so n threads means n-1 workers.
//
// Hand-off without syscalls on the hot path: generation_ is odd while a job is open and even once
// the caller has closed it. A worker that finishes a job polls generation_ for spin_us_, then
// sleeps on cv_; the caller only calls notify when some worker sleeps (sleepers_). A worker
// enters a job by raising active_ and then re-reading generation_; the caller closes the job once
// every chunk is claimed and then waits for active_ == 0. Both sides use seq_cst, so either the
// caller sees the worker in active_ (and waits for it) or the worker sees the job closed (and
// backs out before touching job_): no job's function is touched after run() returns. The same
// store-then-load pairing on sleepers_ / caller_sleeping_ rules out lost wake-ups.
class Pool {
 public:
  Pool() {
    if (pin_from_env()) set_pin(true);
  }
  ~Pool() {
    pin_ = false;  // at exit: stop the workers, leave the caller's affinity alone
    resize(1);
  }

  void resize(int n) {
    std::lock_guard<std::mutex> run_lock(run_mu_);
    const int spin = n == 1 ? 0 : spin_us_from_env();  // a bad value leaves the pool as it was
    stop_workers();
    threads_ = n;
    if (pin_) pin_self(0);
    // With fewer CPUs than threads (e.g. taskset -c 0 and 2 threads) a spinning thread would take
    // the core from the one doing the work. Pinned threads wrap over the set read at start-up.
    const int cpus = pin_ ? static_cast<int>(allowed_cpus().size()) : current_cpu_count();
    spin_us_ = cpus < n ? 0 : spin;
    try {
      for (int i = 0; i + 1 < n; ++i)
        workers_.emplace_back([this, slot = pin_ ? i + 1 : -2] {
          if (slot >= 0) pin_self(slot);
          worker_loop();
        });
    } catch (const std::exception& e) {  // std::system_error (EAGAIN: ulimit -u, no memory), bad_alloc
      const int started = static_cast<int>(workers_.size()) + 1;
      stop_workers();  // a pool of 1 thread needs no worker, so it always works
      threads_ = 1;
      spin_us_ = 0;
      throw Error(detail::concat("cannot start ", n, " compute threads (the system refused thread ", started + 1,
                                 ": ", e.what(), "); use fewer threads"));
    }
  }

  // Restarts the workers so that each starts pinned (or, when turning pinning off, inherits the
  // caller's restored mask).
  void set_pin(bool on) {
    if (on == pin_) return;
    (void)allowed_cpus();  // read before anything is pinned
    pin_ = on;
    if (!on) pin_self(-1);
    resize(threads_);
  }

  int threads() const { return threads_; }
  bool pinned() const { return pin_; }
  int spin_us() const { return spin_us_; }

  void run(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
    if (threads_ == 1 || chunks == 1 || in_worker_) {  // nested calls run inline: no deadlock
      for (int64_t c = 0; c < chunks; ++c) chunk_fn(c);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_);
    job_ = &chunk_fn;
    total_ = chunks;
    error_ = nullptr;
    next_.store(0, std::memory_order_relaxed);
    const uint64_t open = generation_.load(std::memory_order_relaxed) + 1;
    generation_.store(open);  // publishes the fields above to workers that read `open`
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }  // a sleeper is either waiting or will see `open`
      cv_.notify_all();
    }
    in_worker_ = true;  // a parallel_for nested in a chunk on this thread must run inline too
    work_on_job(chunk_fn, chunks);
    in_worker_ = false;
    generation_.store(open + 1);  // every chunk is claimed: no worker may enter from now on
    if (!spin_until(spin_us_, [&] { return active_.load() == 0; })) {
      std::unique_lock<std::mutex> lk(mu_);
      caller_sleeping_.store(true);
      done_cv_.wait(lk, [&] { return active_.load() == 0; });
      caller_sleeping_.store(false);
    }
    job_ = nullptr;
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void work_on_job(const std::function<void(int64_t)>& fn, int64_t total) {
    for (int64_t c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < total;) {
      try {
        fn(c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  static bool is_open(uint64_t generation) { return (generation & 1) != 0; }

  // A job this worker has not run yet is open.
  bool job_waiting(uint64_t seen) const {
    const uint64_t g = generation_.load();
    return is_open(g) && g != seen;
  }

  void worker_loop() {
    in_worker_ = true;
    uint64_t seen = 0;
    for (;;) {
      if (!spin_until(spin_us_, [&] { return stopping_.load(std::memory_order_relaxed) || job_waiting(seen); })) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lk, [&] { return stopping_.load() || job_waiting(seen); });
        sleepers_.fetch_sub(1);
      }
      if (stopping_.load()) return;
      active_.fetch_add(1);
      const uint64_t g = generation_.load();
      if (is_open(g)) {  // inside the job: the caller waits for us before it reuses job_
        seen = g;
        work_on_job(*job_, total_);
      }
      if (active_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
        { std::lock_guard<std::mutex> lk(mu_); }  // the caller is either waiting or will see 0
        done_cv_.notify_one();
      }
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stopping_.store(false);
  }

  std::mutex run_mu_;  // one parallel_for at a time from outside the pool
  std::mutex mu_;      // guards error_ and the sleeps on cv_ / done_cv_
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  // Written by the caller only while no worker is inside a job (see the class comment).
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t total_ = 0;
  std::exception_ptr error_;
  // On separate cache lines: workers poll generation_ while chunks bump next_.
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<int> active_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stopping_{false};
  bool pin_ = false;
  int threads_ = 1;
  int spin_us_ = 0;  // set before the workers start, read-only while they run
  static thread_local bool in_worker_;
};

thread_local bool Pool::in_worker_ = false;

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_num_threads(int n) {
  CORELM_CHECK(n >= 1 && n <= kMaxThreads, ValueError, "thread count must be in [1, ", kMaxThreads, "], got ", n);
  if (n != pool().threads()) pool().resize(n);
}

int num_threads() { return pool().threads(); }

void set_pin_threads(bool on) { pool().set_pin(on); }

bool pin_threads() { return pool().pinned(); }

int thread_spin_microseconds() { return pool().spin_us(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = (n + grain - 1) / grain;
  pool().run(chunks, [&](int64_t c) {
    int64_t begin = c * grain;
    fn(begin, std::min(n, begin + grain));
  });
}

}  // namespace corelm
