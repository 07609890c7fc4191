// What tests that limit a process (RLIMIT_AS) need to know about it: whether AddressSanitizer is
// in the build (its shadow reservation needs terabytes of address space, so an RLIMIT_AS cannot
// be used and timings mean nothing) and the process's current virtual size.
#pragma once
#include <cstddef>
#include <fstream>
#include <string>

namespace corelm::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// The process's virtual size in bytes (VmSize), the base for an RLIMIT_AS a little above it.
inline size_t vm_size() {
  std::ifstream in("/proc/self/status");
  std::string key;
  size_t kb = 0;
  while (in >> key && key != "VmSize:") in.ignore(1 << 20, '\n');
  in >> kb;
  return kb * 1024;
}

}  // namespace corelm::testing
