// One process-wide pool of worker threads used by kernels. 1 thread is a first-class mode: the
// caller's thread does all the work and no worker exists. Work is split into fixed chunks that
// do not depend on the thread count, so results are identical for any thread count as long as
// each chunk writes its own outputs.
#pragma once
#include <cstdint>
#include <functional>

namespace corelm {

// Sets the number of threads kernels may use (>= 1). Default: 1.
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

// Calls fn(begin, end) over [0, n) in chunks of `grain` items, spread over the pool. Blocks until
// all chunks are done; exceptions from fn are rethrown on the caller's thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace corelm
