#include "pipeline/output_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "corelm/error.h"
#include "corelm/safetensors.h"
#include "io/atomic_writer.h"
#include "pipeline/hash.h"

namespace corelm::pipeline {
namespace fs = std::filesystem;

namespace {
std::string numbered(const char* stem, int64_t chunk) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%08lld.jsonl", stem, static_cast<long long>(chunk));
  return buf;
}

bool same_identity(const std::string& run_json, const nlohmann::ordered_json& identity) {
  try {
    std::ifstream in(run_json);
    const nlohmann::json old = nlohmann::json::parse(in);
    return old.value("model_hash", "") == identity.value("model_hash", "") &&
           old.value("task_hash", "") == identity.value("task_hash", "");
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::string part_name(int64_t chunk) { return numbered("part", chunk); }
std::string errors_name(int64_t chunk) { return numbered("errors", chunk); }

OutputDir::OutputDir(std::string dir, const nlohmann::ordered_json& identity, bool overwrite,
                     const std::string& journal_tag)
    : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  CORELM_CHECK(!ec && fs::is_directory(dir_), IOError, "--out ", dir_, ": cannot create the output directory: ",
               ec ? ec.message() : "not a directory");
  CORELM_CHECK(::access(dir_.c_str(), W_OK) == 0, IOError, "--out ", dir_, ": not writable: ", std::strerror(errno));
  Hasher h;
  h.update(identity.dump());
  run_id_ = h.hex();
  const std::string run_json = (fs::path(dir_) / "run.json").string();
  if (fs::exists(run_json) && !overwrite) {
    nlohmann::json old;
    try {
      std::ifstream in(run_json);
      old = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw FormatError(run_json + ": unreadable (" + e.what() + "); remove it or pass --overwrite");
    }
    for (const char* key : {"model_hash", "task_hash"})
      CORELM_CHECK(old.value(key, "") == identity.value(key, ""), ValueError, "--out ", dir_,
                   " holds the output of a different run (", key, " ", old.value(key, ""), " there, ",
                   identity.value(key, ""), " now); use another --out or pass --overwrite");
  } else {
    if (overwrite && fs::exists(run_json) && !same_identity(run_json, identity)) clear_outputs();
    write_json("run.json", identity);
  }
  journal_ = (fs::path(dir_) / ("journal-" + journal_tag + ".jsonl")).string();
}

std::map<int64_t, ChunkStats> OutputDir::done() const {
  std::map<int64_t, ChunkStats> out;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("journal-") || !name.ends_with(".jsonl")) continue;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        continue;  // a line torn by a kill during the append: that chunk is simply redone
      }
      if (!j.is_object() || j.value("run", "") != run_id_) continue;
      ChunkStats s;
      s.chunk = j.value("chunk", int64_t(-1));
      s.records = j.value("records", int64_t(0));
      s.errors = j.value("errors", int64_t(0));
      s.input_tokens = j.value("input_tokens", int64_t(0));
      s.seconds = j.value("seconds", 0.0);
      // The part must still be there (a journal line can only follow its rename).
      if (s.chunk >= 0 && fs::exists(fs::path(dir_) / part_name(s.chunk))) out[s.chunk] = s;
    }
  }
  return out;
}

void OutputDir::discard_temps(const std::vector<int64_t>& chunks) const {
  std::set<std::string> prefixes;
  for (int64_t c : chunks) {
    prefixes.insert(part_name(c) + ".tmp.");
    prefixes.insert(errors_name(c) + ".tmp.");
  }
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.find(".tmp.");
    if (at != std::string::npos && prefixes.count(name.substr(0, at + 5))) fs::remove(e.path());
  }
}

void OutputDir::commit(const ChunkStats& s, const std::string& part_lines, const std::string& error_lines) {
  const fs::path d(dir_);
  if (!error_lines.empty()) {
    io::AtomicWriter w((d / errors_name(s.chunk)).string());
    w.write(error_lines);
    w.commit();
  }
  {
    io::AtomicWriter w((d / part_name(s.chunk)).string());
    w.write(part_lines);
    w.commit();
  }
  nlohmann::ordered_json j{{"run", run_id_},          {"chunk", s.chunk},
                           {"records", s.records},    {"errors", s.errors},
                           {"input_tokens", s.input_tokens}, {"seconds", s.seconds}};
  const std::string line = j.dump() + "\n";
  int fd = ::open(journal_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  CORELM_CHECK(fd >= 0, IOError, journal_, ": cannot open: ", std::strerror(errno));
  // A line torn by an earlier kill or full disk must not swallow this one.
  std::string text = line;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  char last = '\n';
  if (size > 0 && ::pread(fd, &last, 1, size - 1) == 1 && last != '\n') text.insert(text.begin(), '\n');
  ssize_t w = ::write(fd, text.data(), text.size());
  const int err = errno;
  const bool ok = w == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  CORELM_CHECK(ok, IOError, journal_, ": cannot append: ", std::strerror(w < 0 ? err : ENOSPC));
}

// Another run's outputs go, so that `cat part-*` never mixes two runs.
void OutputDir::clear_outputs() const {
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("part-") || name.starts_with("errors-") || name.starts_with("journal-") ||
        name == "manifest.json")
      fs::remove(e.path());
  }
}

void OutputDir::write_json(const std::string& name, const nlohmann::ordered_json& j) const {
  io::write_file_atomic((fs::path(dir_) / name).string(), j.dump(2) + "\n");
}

}  // namespace corelm::pipeline
