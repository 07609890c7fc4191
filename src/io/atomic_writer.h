// Streaming form of write_file_atomic: bytes go to "<path>.tmp.<pid>.<n>" and only commit()
// fsyncs and renames it over `path`; destroying an uncommitted writer removes the temp file.
#pragma once
#include <cstddef>
#include <string>

namespace corelm::io {

class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path);  // IOError naming the temp file when it cannot be created
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace corelm::io
