#include "corelm/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

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

// Workers wait for a job, then pull chunk indices from a shared counter until none are left. The
// caller's thread pulls chunks too, so n threads means n-1 workers.
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
    stop_workers();
    threads_ = n;
    if (pin_) pin_self(0);
    for (int i = 0; i + 1 < n; ++i)
      workers_.emplace_back([this, slot = pin_ ? i + 1 : -2] {
        if (slot >= 0) pin_self(slot);
        worker_loop();
      });
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

  void run(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
    if (threads_ == 1 || chunks == 1 || in_worker_) {  // nested calls run inline: no deadlock
      for (int64_t c = 0; c < chunks; ++c) chunk_fn(c);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &chunk_fn;
      total_ = chunks;
      next_.store(0);
      done_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    in_worker_ = true;  // a parallel_for nested in a chunk on this thread must run inline too
    work_on_job(chunk_fn, chunks);
    in_worker_ = false;
    std::unique_lock<std::mutex> lk(mu_);
    // Also wait for workers that picked up this job to leave it, so none can touch a later job's
    // counter with this job's (then dangling) function.
    done_cv_.wait(lk, [&] { return done_ == total_ && active_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work_on_job(const std::function<void(int64_t)>& fn, int64_t total) {
    int64_t finished = 0;
    for (int64_t c; (c = next_.fetch_add(1)) < total;) {
      try {
        fn(c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      ++finished;
    }
    if (finished) {
      std::lock_guard<std::mutex> lk(mu_);
      done_ += finished;
      if (done_ == total_) done_cv_.notify_all();
    }
  }

  void worker_loop() {
    in_worker_ = true;
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* job;
      int64_t total;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || (job_ && generation_ != seen); });
        if (stopping_) return;
        seen = generation_;
        job = job_;
        total = total_;
        ++active_;
      }
      work_on_job(*job, total);
      {
        std::lock_guard<std::mutex> lk(mu_);
        --active_;
      }
      done_cv_.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stopping_ = false;
  }

  std::mutex run_mu_;  // one parallel_for at a time from outside the pool
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t total_ = 0, done_ = 0;
  int active_ = 0;
  uint64_t generation_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  bool stopping_ = false;
  bool pin_ = false;
  int threads_ = 1;
  static thread_local bool in_worker_;
};

thread_local bool Pool::in_worker_ = false;

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_num_threads(int n) {
  CORELM_CHECK(n >= 1, ValueError, "set_num_threads: need at least 1 thread, got ", n);
  if (n != pool().threads()) pool().resize(n);
}

int num_threads() { return pool().threads(); }

void set_pin_threads(bool on) { pool().set_pin(on); }

bool pin_threads() { return pool().pinned(); }

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
