// The readers under fuzz memory-map a path, so each input is written to a per-process file in
// /dev/shm (RAM-backed: no disk traffic) and opened from there, exactly as a user's file would be.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace corelm::fuzz {

inline const std::string& write_input(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = "/dev/shm/corelm_fuzz_" + std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) __builtin_trap();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

}  // namespace corelm::fuzz
