// The chunk plan is computed once per output directory and kept in OUT/plan.json, so that the
// hundreds of processes of one job do not all read the whole corpus to find chunk boundaries:
// the first process takes OUT/plan.lock (a FileLock: released by the kernel when its holder dies,
// even by kill -9), computes and publishes the plan; the others wait for the lock and then read
// plan.json. The plan is keyed by the input files' names, sizes and modification times and the
// chunk size; a stale plan is recomputed.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeline/input.h"

namespace corelm::pipeline {

// Names, sizes and modification times of the inputs plus the chunk size.
nlohmann::ordered_json input_fingerprint(const std::vector<std::string>& files, int64_t chunk_lines);

Plan cached_plan(const std::vector<std::string>& files, int64_t chunk_lines, const std::string& out_dir);

}  // namespace corelm::pipeline
