// How the packed linears (int8, q4) split their output into tasks: `row_block` rows x
// `panels_per_task` column panels each, run in order on one thread or spread over the pool. Every
// task writes only its own outputs, so a result never depends on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>

#include "corelm/thread_pool.h"

namespace corelm::kernels {

// block(m0, m1, p0, p1): rows [m0, m1) x panels [p0, p1).
template <class Block>
void run_panel_tasks(int64_t m, int64_t panels, int64_t row_block, int64_t panels_per_task, const Block& block) {
  const int64_t col_blocks = (panels + panels_per_task - 1) / panels_per_task;
  const int64_t tasks = (m + row_block - 1) / row_block * col_blocks;
  const auto task = [&](int64_t t) {
    const int64_t m0 = (t / col_blocks) * row_block, p0 = (t % col_blocks) * panels_per_task;
    block(m0, std::min(m0 + row_block, m), p0, std::min(p0 + panels_per_task, panels));
  };
  if (tasks == 1 || num_threads() == 1) {
    for (int64_t t = 0; t < tasks; ++t) task(t);
    return;
  }
  parallel_for(tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) task(t);
  });
}

}  // namespace corelm::kernels
