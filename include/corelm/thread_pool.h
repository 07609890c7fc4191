// One process-wide pool of worker threads used by kernels. 1 thread is a first-class mode: the
// caller's thread does all the work and no worker exists. Work is split into fixed chunks that
// do not depend on the thread count, so results are identical for any thread count as long as
// each chunk writes its own outputs.
#pragma once
#include <cstdint>
#include <functional>

namespace corelm {

// The most threads the pool runs. Far above any core count corelm is run on, it turns a typo
// (--threads 100000) into a clear ValueError instead of tens of thousands of thread stacks.
constexpr int kMaxThreads = 1024;

// Sets the number of threads kernels may use, in [1, kMaxThreads] (ValueError otherwise).
// Default: 1. When the system refuses to start a thread (ulimit -u, memory for its stack), the
// pool goes back to 1 thread and an Error says how many threads were asked for and why they
// could not start.
void set_num_threads(int n);
int num_threads();

// Core pinning, off by default (taskset and friends keep control) and turned on by
// CORELM_PIN_THREADS=1 or set_pin_threads(true): the thread that sets the pool up (the caller of
// set_num_threads / set_pin_threads, which also runs chunks) is pinned to the first CPU of the
// process's allowed set and worker i to the (i+1)-th, wrapping when there are fewer CPUs than
// threads. The allowed set is read (sched_getaffinity) before anything is pinned and kept. A
// failure to pin prints one warning and is otherwise ignored. Turning it off restores the allowed
// set on the caller and the workers. Pinning never changes results.
void set_pin_threads(bool on);
bool pin_threads();

// Hand-off: after a job, workers keep polling for the next one for a bounded time before they
// sleep on a condition variable, and the caller polls for the workers to finish before it sleeps,
// so back-to-back small parallel_for calls (a decode step: dozens of GEMMs of tens of
// microseconds) wake nobody through the kernel. The time is CORELM_SPIN_US microseconds (default
// 50; 0 = never poll), read whenever the pool is (re)sized by set_num_threads or set_pin_threads;
// a value that is not an integer in [0, 100000] throws ValueError there and leaves the pool as it
// was. It is 0 whenever the pool has more threads than CPUs to run them on (e.g. taskset -c 0
// with 2 threads), where a polling thread would take the core from the one doing the work. An
// idle pool sleeps. thread_spin_microseconds() is the time the current pool uses (0 with 1 thread).
int thread_spin_microseconds();

// Calls fn(begin, end) over [0, n) in chunks of `grain` items, spread over the pool. Blocks until
// all chunks are done; exceptions from fn are rethrown on the caller's thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace corelm
