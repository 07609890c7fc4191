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

// Calls fn(begin, end) over [0, n) in chunks of `grain` items, spread over the pool. Blocks until
// all chunks are done; exceptions from fn are rethrown on the caller's thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace corelm
