// Durable writes and inter-process locks (include/corelm/durable.h). Everything here is plain
// POSIX + Linux: rename(2) for atomic replacement, link(2) for compare-and-create,
// renameat2(RENAME_EXCHANGE) for swapping a folder, flock(2) for locks that die with their holder.
#include "corelm/durable.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "corelm/error.h"

namespace corelm {
namespace fs = std::filesystem;
namespace {

std::atomic<unsigned> g_counter{0};

std::string parent_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw IOError(what + " '" + path + "': " + std::strerror(err));
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_path(const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
  if (fd < 0) {
    if (dir) return;  // best effort for folders
    fail("cannot open", path, errno);
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && !dir) fail("cannot fsync", path, err);
}

void fsync_tree(const fs::path& root) {
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) fsync_path(e.path().string(), false);
    else if (e.is_directory()) fsync_path(e.path().string(), true);
  }
  fsync_path(root.string(), true);
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); 0 when unreadable.
uint64_t start_ticks_of(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = all.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(all.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

}  // namespace

// ---- AtomicWriter -------------------------------------------------------------------------

AtomicWriter::AtomicWriter(std::string path) : path_(std::move(path)) {
  CORELM_CHECK(!path_.empty(), IOError, "cannot write a file with an empty path");
  // pid + a counter keep concurrent writers (threads or processes) from sharing a temp name; the
  // ".tmp." infix is what the corpus runner's clean-up of abandoned temp files looks for.
  tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_counter++);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", tmp_, errno);
}

AtomicWriter::~AtomicWriter() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicWriter::write(const void* data, size_t n) {
  CORELM_CHECK(fd_ >= 0 && !committed_, IOError, "write to a closed file '", tmp_, "'");
  write_all(fd_, data, n, path_);
}

void AtomicWriter::commit() {
  CORELM_CHECK(fd_ >= 0 && !committed_, IOError, "commit of a closed file '", tmp_, "'");
  if (::fsync(fd_) != 0) fail("cannot fsync", path_, errno);
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("cannot close", path_, errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename " + tmp_ + " to", path_, errno);
  committed_ = true;
  fsync_dir(parent_of(path_));
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicWriter w(path);
  w.write(bytes);
  w.commit();
}

void fsync_dir(const std::string& dir) { fsync_path(dir, true); }

std::string unique_sibling(const std::string& target, const std::string& tag) {
  std::string t = target;
  while (t.size() > 1 && t.back() == '/') t.pop_back();
  const std::string parent = parent_of(t);
  return (parent == "/" ? "" : parent) + "/." + name_of(t) + "." + tag + "." + std::to_string(::getpid()) + "." +
         std::to_string(g_counter++);
}

bool create_file_exclusive(const std::string& path, const std::string& bytes) {
  CORELM_CHECK(!path.empty(), IOError, "cannot create a file with an empty path");
  if (::access(path.c_str(), F_OK) == 0) return false;
  const std::string tmp = unique_sibling(path, "new");
  {
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot create", tmp, errno);
    try {
      write_all(fd, bytes.data(), bytes.size(), path);
      if (::fsync(fd) != 0) fail("cannot fsync", path, errno);
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    ::close(fd);
  }
  const int rc = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (rc == 0) {
    fsync_dir(parent_of(path));
    return true;
  }
  if (err == EEXIST) return false;
  if (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP) {
    // A file system without hard links: O_EXCL still decides the race, though a crash can then
    // leave a short file (readers of such records must validate them).
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (errno == EEXIST) return false;
      fail("cannot create", path, errno);
    }
    try {
      write_all(fd, bytes.data(), bytes.size(), path);
      if (::fsync(fd) != 0) fail("cannot fsync", path, errno);
    } catch (...) {
      ::close(fd);
      ::unlink(path.c_str());
      throw;
    }
    ::close(fd);
    return true;
  }
  fail("cannot create", path, err);
}

long temp_writer_pid(const std::string& file_name, const std::string& prefix) {
  if (!file_name.starts_with(prefix)) return 0;
  size_t i = prefix.size(), end = i;
  while (end < file_name.size() && end - i < 10 && file_name[end] >= '0' && file_name[end] <= '9') ++end;
  if (end == i || (end < file_name.size() && file_name[end] != '.')) return 0;
  return std::strtol(file_name.c_str() + i, nullptr, 10);
}

bool process_alive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// ---- StagedDir ----------------------------------------------------------------------------

StagedDir::StagedDir(std::string target, bool seed_from_target) : target_(std::move(target)) {
  while (target_.size() > 1 && target_.back() == '/') target_.pop_back();
  CORELM_CHECK(!target_.empty(), IOError, "cannot write a folder with an empty path");
  std::error_code ec;
  if (fs::exists(target_, ec) && !fs::is_directory(target_, ec))
    throw IOError("'" + target_ + "' exists and is not a folder");
  staging_ = unique_sibling(target_, "staging");
  if (::mkdir(staging_.c_str(), 0755) != 0) fail("cannot create a folder beside", target_, errno);
  if (seed_from_target && fs::is_directory(target_, ec)) {
    try {
      fs::copy(target_, staging_, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    } catch (const fs::filesystem_error& e) {
      fs::remove_all(staging_, ec);
      throw IOError("cannot copy '" + target_ + "' to '" + staging_ + "': " + e.code().message());
    }
  }
}

StagedDir::~StagedDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedDir::commit() {
  CORELM_CHECK(!committed_, IOError, "folder '", target_, "' committed twice");
  try {
    fsync_tree(staging_);
  } catch (const fs::filesystem_error& e) {
    throw IOError("cannot sync '" + staging_ + "': " + e.code().message());
  }
  if (::rename(staging_.c_str(), target_.c_str()) == 0) {
    // The target did not exist, or was an empty folder that rename(2) replaces.
    committed_ = true;
    fsync_dir(parent_of(target_));
    return;
  }
  if (errno != ENOTEMPTY && errno != EEXIST) fail("cannot rename " + staging_ + " to", target_, errno);
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    committed_ = true;
    fsync_dir(parent_of(target_));
    std::error_code ec;
    fs::remove_all(staging_, ec);  // now the old content
    return;
  }
  // No RENAME_EXCHANGE on this file system: move the old folder aside first. A crash between
  // the two renames leaves the old content complete under ".<name>.old.*" beside the target.
  const std::string old = unique_sibling(target_, "old");
  if (::rename(target_.c_str(), old.c_str()) != 0) fail("cannot move aside", target_, errno);
  if (::rename(staging_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    ::rename(old.c_str(), target_.c_str());
    fail("cannot rename " + staging_ + " to", target_, err);
  }
  committed_ = true;
  fsync_dir(parent_of(target_));
  std::error_code ec;
  fs::remove_all(old, ec);
}

// ---- FileLock -----------------------------------------------------------------------------

std::string LockHolder::describe() const {
  if (pid <= 0) return "an unknown process";
  std::string s = "pid " + std::to_string(pid) + " on host " + (host.empty() ? "?" : host);
  if (start_ticks) s += " (started at tick " + std::to_string(start_ticks) + ")";
  return s;
}

bool LockHolder::alive_here() const {
  if (host != host_name() || !process_alive(pid)) return false;
  return start_ticks == 0 || start_ticks_of(pid) == start_ticks;
}

LockHolder FileLock::self() {
  LockHolder h;
  h.pid = ::getpid();
  h.host = host_name();
  h.start_ticks = start_ticks_of(h.pid);
  return h;
}

LockHolder FileLock::read_holder(const std::string& path) {
  LockHolder h;
  std::ifstream in(path);
  std::string key;
  while (in >> key) {
    if (key == "pid") in >> h.pid;
    else if (key == "host") in >> h.host;
    else if (key == "start_ticks") in >> h.start_ticks;
  }
  return h;
}

std::unique_ptr<FileLock> FileLock::try_acquire(const std::string& path, LockHolder* holder) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot create the lock file", path, errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err != EWOULDBLOCK && err != EINTR) fail("cannot lock", path, err);
      if (holder) *holder = read_holder(path);
      return nullptr;
    }
    // The previous holder may have removed the file between our open and our flock: then we
    // locked an orphaned inode and must retry on the file now at `path`.
    struct stat mine {}, now {};
    if (::fstat(fd, &mine) != 0 || ::stat(path.c_str(), &now) != 0 || mine.st_ino != now.st_ino ||
        mine.st_dev != now.st_dev) {
      ::close(fd);
      continue;
    }
    const LockHolder me = self();
    const std::string rec = "pid " + std::to_string(me.pid) + "\nhost " + me.host + "\nstart_ticks " +
                            std::to_string(me.start_ticks) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, rec.data(), rec.size(), 0) != static_cast<ssize_t>(rec.size())) {
      const int err = errno;
      ::close(fd);
      fail("cannot write the lock file", path, err);
    }
    return std::unique_ptr<FileLock>(new FileLock(path, fd));
  }
  throw IOError("cannot lock '" + path + "': it keeps being replaced");
}

std::unique_ptr<FileLock> FileLock::acquire(const std::string& path,
                                            const std::function<void(const LockHolder&)>& on_wait,
                                            std::chrono::milliseconds hint_after) {
  const auto start = std::chrono::steady_clock::now();
  bool hinted = false;
  for (;;) {
    LockHolder h;
    if (auto lock = try_acquire(path, &h)) return lock;
    if (!hinted && on_wait && std::chrono::steady_clock::now() - start >= hint_after) {
      hinted = true;
      on_wait(h);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::unique_ptr<FileLock> FileLock::acquire_or_throw(const std::string& path, const std::string& what) {
  LockHolder h;
  if (auto lock = try_acquire(path, &h)) return lock;
  throw IOError(what + ": '" + path + "' is held by " + h.describe() +
                " (it is released when that process ends)");
}

FileLock::~FileLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding it: a waiter then retries on a fresh file
  ::close(fd_);
}

}  // namespace corelm
