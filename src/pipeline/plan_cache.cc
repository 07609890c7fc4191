#include "pipeline/plan_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "corelm/error.h"
#include "corelm/safetensors.h"

namespace corelm::pipeline {
namespace fs = std::filesystem;

nlohmann::ordered_json input_fingerprint(const std::vector<std::string>& files, int64_t chunk_lines) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& f : files) {
    struct stat st{};
    CORELM_CHECK(::stat(f.c_str(), &st) == 0, IOError, f, ": ", std::strerror(errno));
    list.push_back({{"path", f},
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
    files.push_back({{"path", plan.files[f]}, {"bytes", plan.file_bytes[f]}, {"lines", lines}, {"offsets", offsets}});
  }
  return {{"key", key}, {"files", files}, {"empty_files", plan.empty_files}};
}

// Chunk k of a file starts at line k * chunk_lines + 1, so offsets and line counts rebuild it.
Plan from_json(const nlohmann::json& j, int64_t chunk_lines) {
  Plan plan;
  for (const auto& f : j.at("files")) {
    const int file = static_cast<int>(plan.files.size());
    plan.files.push_back(f.at("path").get<std::string>());
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
  plan.empty_files = j.at("empty_files").get<std::vector<std::string>>();
  return plan;
}

bool try_load(const fs::path& path, const nlohmann::ordered_json& key, int64_t chunk_lines, Plan& plan) {
  std::ifstream in(path);
  if (!in) return false;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("key") != nlohmann::json(key)) return false;
    plan = from_json(j, chunk_lines);
    return true;
  } catch (const std::exception&) {
    return false;  // unreadable or from another version: recompute
  }
}

}  // namespace

Plan cached_plan(const std::vector<std::string>& files, int64_t chunk_lines, const std::string& out_dir) {
  const nlohmann::ordered_json key = input_fingerprint(files, chunk_lines);
  const fs::path plan_path = fs::path(out_dir) / "plan.json", lock_path = fs::path(out_dir) / "plan.lock";
  const auto start = std::chrono::steady_clock::now();
  bool hinted = false;
  for (;;) {
    Plan plan;
    if (try_load(plan_path, key, chunk_lines, plan)) return plan;
    const int fd = ::open(lock_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      char host[256] = {0};
      ::gethostname(host, sizeof host - 1);
      const std::string who = std::string(host) + ":" + std::to_string(::getpid()) + "\n";
      (void)!::write(fd, who.data(), who.size());
      ::close(fd);
      try {
        plan = make_plan(files, chunk_lines);
        io::write_file_atomic(plan_path.string(), to_json(plan, key).dump() + "\n");
      } catch (...) {
        fs::remove(lock_path);
        throw;
      }
      fs::remove(lock_path);
      return plan;
    }
    CORELM_CHECK(errno == EEXIST, IOError, lock_path.string(), ": cannot create: ", std::strerror(errno));
    // Another process is planning; a killed one leaves its lock behind, which only a person can
    // judge safely across hosts.
    if (!hinted && std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
      std::ifstream who(lock_path);
      std::string holder;
      std::getline(who, holder);
      std::cerr << "run: waiting for " << lock_path.string() << " (held by " << holder
                << "); delete it if that process is gone\n";
      hinted = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace corelm::pipeline
