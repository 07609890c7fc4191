#include "pipeline/output_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <vector>

#include "corelm/durable.h"
#include "corelm/error.h"
#include "pipeline/hash.h"

namespace corelm::pipeline {
namespace fs = std::filesystem;

namespace {
std::string numbered(const char* stem, int64_t chunk) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%08lld.jsonl", stem, static_cast<long long>(chunk));
  return buf;
}

// A short description of a run for the refusal message: the task, its labels, the model.
std::string describe_run(const nlohmann::json& id) {
  if (!id.is_object()) return "an unreadable run.json";
  const nlohmann::json t = id.contains("task") && id["task"].is_object() ? id["task"] : nlohmann::json::object();
  std::string s = "task '" + (t.contains("task") && t["task"].is_string() ? t["task"].get<std::string>() : "?") + "'";
  if (t.contains("labels") && t["labels"].is_array()) {
    std::string labels;
    for (const auto& l : t["labels"])
      labels += (labels.empty() ? "" : ",") + (l.is_string() ? l.get<std::string>() : l.dump());
    s += " (labels " + labels + ")";
  }
  if (id.contains("model") && id["model"].is_string()) s += " with model " + id["model"].get<std::string>();
  return s;
}

// What differs between two run identities, in words ("labels, template" or "model ...").
std::string differences(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> diff;
  if (a.value("model_hash", "") != b.value("model_hash", "")) diff.push_back("model (weights or tokenizer)");
  const nlohmann::json ta = a.contains("task") ? a["task"] : nlohmann::json();
  const nlohmann::json tb = b.contains("task") ? b["task"] : nlohmann::json();
  if (ta.is_object() && tb.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : ta.items()) keys.insert(k);
    for (const auto& [k, v] : tb.items()) keys.insert(k);
    for (const auto& k : keys)
      if (!ta.contains(k) || !tb.contains(k) || ta[k] != tb[k]) diff.push_back(k);
  }
  for (const char* k : {"inputs", "chunk_records", "max_line_bytes"})
    if (!a.contains(k) || !b.contains(k) || a[k] != b[k]) diff.push_back(k);
  if (diff.empty()) diff.push_back("the inputs' sizes or modification times, or --precision");
  std::string s;
  for (const auto& d : diff) s += (s.empty() ? "" : ", ") + d;
  return s;
}

bool same_identity(const nlohmann::json& old, const nlohmann::ordered_json& identity) {
  return old.is_object() && old.value("model_hash", "") == identity.value("model_hash", "") &&
         old.value("task_hash", "") == identity.value("task_hash", "");
}

}  // namespace

std::string part_name(int64_t chunk) { return numbered("part", chunk); }
std::string errors_name(int64_t chunk) { return numbered("errors", chunk); }

// The identity decision. Three pieces make "check the identity, then write under it" one atomic
// step for every process that shares --out:
//  - OUT/run.lock (a FileLock, held only while deciding) serialises the decisions;
//  - run.json is created by compare-and-create, so two first runs never both write it; a loser
//    reads the winner's identity and is refused when it differs;
//  - every process of the adopted identity then holds OUT/run.active shared (flock LOCK_SH) for
//    its whole life, and --overwrite may only replace the identity while it can take that lock
//    exclusively, so it never clears the parts of a run that is still writing them.
// Processes of the same identity (shards, MPI ranks, restarts) all pass and run side by side.
OutputDir::OutputDir(std::string dir, const nlohmann::ordered_json& identity, bool overwrite,
                     const std::string& journal_tag)
    : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  CORELM_CHECK(!ec && fs::is_directory(dir_), IOError, "--out ", dir_, ": cannot create the output directory: ",
               ec ? ec.message() : "not a directory");
  CORELM_CHECK(::access(dir_.c_str(), W_OK) == 0, IOError, "--out ", dir_, ": not writable: ", std::strerror(errno));
  const std::string text = identity.dump(2) + "\n";
  Hasher h;
  h.update(identity.dump());
  run_id_ = h.hex();
  const fs::path d(dir_);
  const std::string run_json = (d / "run.json").string(), active = (d / "run.active").string();
  const std::string lock = (d / "run.lock").string();
  const auto deciding = FileLock::acquire(lock, [&](const LockHolder& holder) {
    std::cerr << "run: waiting for " << lock << " held by " << holder.describe() << "\n";
  });
  active_fd_ = ::open(active.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CORELM_CHECK(active_fd_ >= 0, IOError, active, ": cannot create: ", std::strerror(errno));
  try {
    adopt_identity(run_json, text, identity, overwrite);
  } catch (...) {
    ::close(active_fd_);  // the destructor does not run for a constructor that throws
    throw;
  }
  journal_ = (d / ("journal-" + journal_tag + ".jsonl")).string();
}

void OutputDir::adopt_identity(const std::string& run_json, const std::string& text,
                               const nlohmann::ordered_json& identity, bool overwrite) {
  if (!create_file_exclusive(run_json, text)) {
    nlohmann::json old;
    std::string unreadable;
    try {
      std::ifstream in(run_json);
      old = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      unreadable = e.what();
    }
    if (!unreadable.empty() || !same_identity(old, identity)) {
      if (!overwrite) {
        CORELM_CHECK(unreadable.empty(), FormatError, run_json, ": unreadable (", unreadable,
                     "); remove it or pass --overwrite");
        throw ValueError("--out " + dir_ + " holds the output of another run: " + describe_run(old) + " there, " +
                         describe_run(identity) + " now (they differ in: " + differences(old, identity) +
                         "); use another --out or pass --overwrite");
      }
      if (::flock(active_fd_, LOCK_EX | LOCK_NB) != 0)
        throw IOError("--out " + dir_ + ": --overwrite refused: another run (" + describe_run(old) +
                      ") is still writing there; wait for it to end or use another --out");
      clear_outputs();
      write_file_atomic(run_json, text);
    }
  }
  // Converts an exclusive lock taken above; no other process decides meanwhile (run.lock).
  CORELM_CHECK(::flock(active_fd_, LOCK_SH) == 0, IOError, dir_, "/run.active: cannot lock: ", std::strerror(errno));
}

OutputDir::~OutputDir() {
  if (active_fd_ >= 0) ::close(active_fd_);
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
  // AtomicWriter's temp names are "<name>.tmp.<pid>.<n>"; a hidden ".<name>.tmp.<pid>.<n>" is
  // matched too.
  std::set<std::string> prefixes;
  for (int64_t c : chunks)
    for (const std::string& n : {part_name(c), errors_name(c)}) {
      prefixes.insert(n + ".tmp.");
      prefixes.insert("." + n + ".tmp.");
    }
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.find(".tmp.", 1);
    if (at == std::string::npos || !prefixes.count(name.substr(0, at + 5))) continue;
    // The same shard run twice at once (a restart while the old process still lives): leave the
    // temp file a live writer on this host is about to rename. The pid follows ".tmp.".
    const long pid = temp_writer_pid(name, name.substr(0, at + 5));
    if (pid != ::getpid() && process_alive(pid)) continue;
    std::error_code ec;
    fs::remove(e.path(), ec);  // another process may have removed it first
  }
}

void OutputDir::commit(const ChunkStats& s, const std::string& part_lines, const std::string& error_lines) {
  const fs::path d(dir_);
  if (!error_lines.empty()) {
    AtomicWriter w((d / errors_name(s.chunk)).string());
    w.write(error_lines);
    w.commit();
  }
  {
    AtomicWriter w((d / part_name(s.chunk)).string());
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
        name.starts_with(".part-") || name.starts_with(".errors-") || name == "manifest.json")
      fs::remove(e.path());
  }
}

void OutputDir::write_json(const std::string& name, const nlohmann::ordered_json& j) const {
  write_file_atomic((fs::path(dir_) / name).string(), j.dump(2) + "\n");
}

}  // namespace corelm::pipeline
