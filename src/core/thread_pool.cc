#include "corelm/thread_pool.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "corelm/error.h"

namespace corelm {

namespace {

// Workers wait for a job, then pull chunk indices from a shared counter until none are left. The
// caller's thread pulls chunks too, so n threads means n-1 workers.
class Pool {
 public:
  ~Pool() { resize(1); }

  void resize(int n) {
    std::lock_guard<std::mutex> run_lock(run_mu_);
    stop_workers();
    threads_ = n;
    for (int i = 0; i + 1 < n; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  int threads() const { return threads_; }

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
