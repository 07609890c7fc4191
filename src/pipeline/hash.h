// A fast 64-bit content hash (not cryptographic) for the model and task identities that guard an
// output directory against being resumed by a different run.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace corelm::pipeline {

class Hasher {
 public:
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex() const;  // 16 hex digits

 private:
  uint64_t h_ = 0x9e3779b97f4a7c15ull;
  uint64_t n_ = 0;
};

// Hash of a file's bytes (IOError naming it when unreadable).
void hash_file(Hasher& h, const std::string& path);

}  // namespace corelm::pipeline
