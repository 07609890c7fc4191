#include "pipeline/plan_cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/utf8.h"

namespace corelm::pipeline {
namespace fs = std::filesystem;

nlohmann::ordered_json input_fingerprint(const std::vector<std::string>& files, int64_t chunk_lines) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& f : files) {
    struct stat st{};
    CORELM_CHECK(::stat(f.c_str(), &st) == 0, IOError, f, ": ", std::strerror(errno));
    // Escaped so that the fingerprint is valid JSON for any legal file name.
    list.push_back({{"path", escape_invalid_utf8(f)},
                    {"size", static_cast<int64_t>(st.st_size)},
                    {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec}});
  }
  return {{"files", list}, {"chunk_records", chunk_lines}};
}

namespace {

nlohmann::ordered_json to_json(const Plan& plan, const nlohmann::ordered_json& key) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (size_t f = 0; f < plan.files.size(); ++f) {
    std::vector<uint64_t> offsets;
    int64_t lines = 0;
    for (const Chunk& c : plan.chunks)
      if (c.file == static_cast<int>(f)) {
        offsets.push_back(c.offset);
        lines += c.lines;
      }
    files.push_back({{"path", escape_invalid_utf8(plan.files[f])},
                     {"bytes", plan.file_bytes[f]},
                     {"lines", lines},
                     {"offsets", offsets}});
  }
  // Empty files by index: the names are in the key (escaped where they are not UTF-8).
  std::vector<int> empty;
  for (const auto& e : plan.empty_files)
    empty.push_back(static_cast<int>(std::find(plan.files.begin(), plan.files.end(), e) - plan.files.begin()));
  return {{"version", 2}, {"key", key}, {"files", files}, {"empty_files", empty}};
}

// Chunk k of a file starts at line k * chunk_lines + 1, so offsets and line counts rebuild it.
// The names come from the caller, not from plan.json, where a name that is not UTF-8 is escaped.
Plan from_json(const nlohmann::json& j, const std::vector<std::string>& names, int64_t chunk_lines) {
  Plan plan;
  CORELM_CHECK(j.at("files").size() == names.size(), FormatError, "plan.json: wrong number of files");
  for (const auto& f : j.at("files")) {
    const int file = static_cast<int>(plan.files.size());
    plan.files.push_back(names[static_cast<size_t>(file)]);
    const uint64_t bytes = f.at("bytes").get<uint64_t>();
    const int64_t lines = f.at("lines").get<int64_t>();
    const auto offsets = f.at("offsets").get<std::vector<uint64_t>>();
    for (size_t k = 0; k < offsets.size(); ++k) {
      Chunk c;
      c.index = static_cast<int64_t>(plan.chunks.size());
      c.file = file;
      c.first_line = static_cast<int64_t>(k) * chunk_lines + 1;
      c.lines = std::min<int64_t>(chunk_lines, lines - static_cast<int64_t>(k) * chunk_lines);
      c.offset = offsets[k];
      c.bytes = (k + 1 < offsets.size() ? offsets[k + 1] : bytes) - offsets[k];
      plan.chunks.push_back(c);
    }
    plan.file_bytes.push_back(bytes);
    plan.total_bytes += bytes;
  }
  for (const auto& e : j.at("empty_files")) {
    const int f = e.get<int>();
    CORELM_CHECK(f >= 0 && f < static_cast<int>(names.size()), FormatError, "plan.json: bad empty file index");
    plan.empty_files.push_back(names[static_cast<size_t>(f)]);
  }
  return plan;
}

bool try_load(const fs::path& path, const nlohmann::ordered_json& key, const std::vector<std::string>& names,
              int64_t chunk_lines, Plan& plan) {
  std::ifstream in(path);
  if (!in) return false;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("key") != nlohmann::json(key)) return false;
    plan = from_json(j, names, chunk_lines);
    return true;
  } catch (const std::exception&) {
    return false;  // unreadable or from another version: recompute
  }
}

}  // namespace

Plan cached_plan(const std::vector<std::string>& files, int64_t chunk_lines, const std::string& out_dir) {
  const nlohmann::ordered_json key = input_fingerprint(files, chunk_lines);
  const fs::path plan_path = fs::path(out_dir) / "plan.json", lock_path = fs::path(out_dir) / "plan.lock";
  Plan plan;
  if (try_load(plan_path, key, files, chunk_lines, plan)) return plan;
  // One process plans; the others wait for its lock, then find plan.json. The lock dies with its
  // holder (even by kill -9), so a killed planner never blocks the next run: a waiter then takes
  // the lock and plans itself.
  const auto lock = FileLock::acquire(lock_path.string(), [&](const LockHolder& holder) {
    std::cerr << "run: waiting for " << lock_path.string() << ": " << holder.describe()
              << " is planning the chunks (reading every input once)\n";
  });
  if (try_load(plan_path, key, files, chunk_lines, plan)) return plan;
  plan = make_plan(files, chunk_lines);
  write_file_atomic(plan_path.string(), to_json(plan, key).dump() + "\n");
  return plan;
}

}  // namespace corelm::pipeline
