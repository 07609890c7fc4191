// FNV-1a, 64 bit, over bytes: a hash stable across builds and runs (std::hash is neither), for
// seeds derived from content (a queued request's sampling seed, a classify batch's dropout masks)
// and content fingerprints (an offline batch row's input hash). Not for hash tables under attack.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace corelm {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// Continues the hash `h` over n bytes at p (h = kFnv1aOffset starts one). A name of its own, so a
// string literal never binds to it with `h` taken as the length.
inline uint64_t fnv1a_bytes(const void* p, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aOffset) { return fnv1a_bytes(s.data(), s.size(), h); }

}  // namespace corelm
