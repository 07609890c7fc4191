// Durable writes and inter-process locks: the one mechanism every writer in corelm uses.
//   AtomicWriter / write_file_atomic  a file is replaced whole (unique temp name beside it, fsync,
//                                     rename, fsync of the folder) or not at all;
//   create_file_exclusive             compare-and-create: a file appears whole, once, or the call
//                                     reports that it exists (two writers never both win);
//   StagedDir                         a folder is written under a unique temp name beside the
//                                     target and swapped in by one rename (the old one kept until
//                                     the new one is complete);
//   FileLock                          an exclusive lock held by a live process (flock on a lock
//                                     file that records pid, host and process start time); the
//                                     kernel drops it when its holder dies, even by kill -9.
// Contract and failure cases: docs/ARCHITECTURE.md, "Durability".
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace corelm {

// Streaming atomic file: bytes go to "<dir>/.<name>.tmp.<pid>.<n>"; commit() fsyncs and renames
// it over `path`; destroying an uncommitted writer (error path, exception) removes the temp file.
class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path);  // IOError naming the file when it cannot be created
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, size_t n);  // IOError (e.g. "No space left on device") naming the file
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

void write_file_atomic(const std::string& path, const std::string& bytes);

// Creates `path` holding `bytes` only if nothing is there (the bytes are complete before the
// name appears: written to a temp file, fsynced, then hard-linked). Returns false when `path`
// already exists; IOError on any other failure.
bool create_file_exclusive(const std::string& path, const std::string& bytes);

// fsyncs a folder so that renames and creations inside it survive a power cut (best effort:
// a folder that cannot be opened is skipped).
void fsync_dir(const std::string& dir);

// Unique temp name beside `target`: "<parent>/.<name>.<tag>.<pid>.<n>".
std::string unique_sibling(const std::string& target, const std::string& tag);

// The pid in a temp name that AtomicWriter ("<name>.tmp.<pid>.<n>") or unique_sibling
// (".<name>.<tag>.<pid>.<n>") made, given the part of the name before the pid; 0 when the name
// does not start with that prefix or no pid follows it (digits, then '.' or the end).
long temp_writer_pid(const std::string& file_name, const std::string& prefix);

// True while a process with this pid runs on this host (signal 0 delivered, or refused with EPERM).
bool process_alive(long pid);

// A folder written as a whole. Files go into path() (a fresh folder beside the target); commit()
// fsyncs every file and the folder, then renames it onto the target: when the target exists the
// two are swapped in one step (renameat2 RENAME_EXCHANGE) and the old content is removed after,
// so a reader or a crash sees the complete old folder or the complete new one. An uncommitted
// StagedDir removes its folder. `seed_from_target` copies the target's current files in first
// (for writers that replace only some files).
class StagedDir {
 public:
  explicit StagedDir(std::string target, bool seed_from_target = false);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::string& path() const { return staging_; }
  const std::string& target() const { return target_; }
  void commit();

 private:
  std::string target_, staging_;
  bool committed_ = false;
};

// Who holds a lock, as its lock file records it.
struct LockHolder {
  long pid = 0;
  std::string host;
  uint64_t start_ticks = 0;  // /proc/<pid>/stat field 22: tells a reused pid from the holder
  std::string describe() const;  // "pid 123 on host h (started at tick 456)" or "an unknown process"
  bool alive_here() const;       // same host and that pid still runs with that start time
};

class FileLock {
 public:
  // Takes the lock without waiting; nullptr when a live process holds it (its record goes to
  // *holder when given). IOError when the lock file cannot be created.
  static std::unique_ptr<FileLock> try_acquire(const std::string& path, LockHolder* holder = nullptr);
  // Waits for the lock, calling on_wait(holder) once after `hint_after` of waiting.
  static std::unique_ptr<FileLock> acquire(const std::string& path,
                                           const std::function<void(const LockHolder&)>& on_wait = {},
                                           std::chrono::milliseconds hint_after = std::chrono::seconds(10));
  // Takes the lock or throws IOError "<what>: <path> is held by pid ... on host ..." .
  static std::unique_ptr<FileLock> acquire_or_throw(const std::string& path, const std::string& what);
  ~FileLock();  // removes the lock file, then releases it
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  static LockHolder read_holder(const std::string& path);  // empty holder when absent/unreadable
  static LockHolder self();

 private:
  FileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

}  // namespace corelm
