// Atomic file replacement: write a temp file next to the target, fsync it, rename it over the
// target and fsync the folder, so readers see either the old or the new file, never a torn one.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "corelm/error.h"
#include "corelm/safetensors.h"
#include "io/atomic_writer.h"

namespace corelm::io {
namespace {

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw IOError(what + " '" + path + "': " + std::strerror(err));
}

}  // namespace

AtomicWriter::AtomicWriter(std::string path) : path_(std::move(path)) {
  CORELM_CHECK(!path_.empty(), IOError, "cannot write a file with an empty path");
  // pid + a counter keep concurrent writers (threads or processes) from sharing a temp name.
  static std::atomic<unsigned> counter{0};
  tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
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
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", tmp_, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicWriter::commit() {
  CORELM_CHECK(fd_ >= 0 && !committed_, IOError, "commit of a closed file '", tmp_, "'");
  if (::fsync(fd_) != 0) fail("cannot fsync", tmp_, errno);
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("cannot close", tmp_, errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename " + tmp_ + " to", path_, errno);
  committed_ = true;
  // Make the rename itself durable; a folder that cannot be opened is not worth failing for.
  int dfd = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicWriter w(path);
  w.write(bytes);
  w.commit();
}

}  // namespace corelm::io
