// The non-finite scan (include/corelm/finite.h): blocks of floats tested by their exponent bits in
// a branch-free loop the compiler vectorizes at -O2; only a block that holds a NaN or infinity is
// walked element by element to find its index.
#include "corelm/finite.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace corelm {

namespace {

constexpr size_t kFiniteBlock = 4096;

// Non-zero when one of the kFiniteBlock floats at p has an all-ones exponent (NaN or inf). The
// constant trip count and the branch-free body let the compiler vectorize it even at -O2.
uint32_t block_has_non_finite(const float* p) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t bad = 0;
  for (size_t j = 0; j < kFiniteBlock; ++j) {
    uint32_t bits;
    std::memcpy(&bits, p + j, sizeof bits);
    bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return bad;
}

// The same test fused into a copy of one block (one read of the source, one write).
uint32_t copy_block_has_non_finite(const float* src, float* dst) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t bad = 0;
  for (size_t j = 0; j < kFiniteBlock; ++j) {
    uint32_t bits;
    std::memcpy(&bits, src + j, sizeof bits);
    std::memcpy(dst + j, &bits, sizeof bits);
    bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return bad;
}

}  // namespace

size_t first_non_finite(const float* p, size_t n) {
  for (size_t i = 0; i < n; i += kFiniteBlock) {
    const size_t end = std::min(n, i + kFiniteBlock);
    if (end - i == kFiniteBlock && !block_has_non_finite(p + i)) continue;
    for (size_t j = i; j < end; ++j)
      if (!std::isfinite(p[j])) return j;
  }
  return n;
}

size_t copy_checking_finite(const float* src, float* dst, size_t n) {
  // One pass: each value is tested as it is copied (no second read of the parameter).
  for (size_t i = 0; i < n; i += kFiniteBlock) {
    const size_t len = std::min(n - i, kFiniteBlock);
    if (len == kFiniteBlock) {
      if (!copy_block_has_non_finite(src + i, dst + i)) continue;
    } else {
      std::memcpy(dst + i, src + i, len * sizeof(float));
    }
    const size_t bad = first_non_finite(dst + i, len);
    if (bad != len) return i + bad;
  }
  return n;
}

}  // namespace corelm
