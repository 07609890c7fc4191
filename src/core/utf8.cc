#include "corelm/utf8.h"

#include <cstdint>
#include <cstdio>

#include "corelm/error.h"

namespace corelm {
namespace {

// Length of the valid sequence starting at p[0] (1..4), or 0 when it is invalid.
size_t valid_sequence_length(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  if (c < 0xC2 || c > 0xF4) return 0;
  const size_t len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (n < len) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((p[k] & 0xC0) != 0x80) return 0;
  if (c == 0xE0 && p[1] < 0xA0) return 0;  // overlong 3-byte
  if (c == 0xED && p[1] > 0x9F) return 0;  // surrogates
  if (c == 0xF0 && p[1] < 0x90) return 0;  // overlong 4-byte
  if (c == 0xF4 && p[1] > 0x8F) return 0;  // above U+10FFFF
  return len;
}

}  // namespace

size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = valid_sequence_length(p + i, s.size() - i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string escape_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = valid_sequence_length(p + i, s.size() - i);
    if (len == 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", p[i]);
      out += buf;
      ++i;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

void require_utf8(std::string_view s, const std::string& what) {
  const size_t at = first_invalid_utf8(s);
  if (at == std::string_view::npos) return;
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned char>(s[at]));
  throw ValueError(what + " is not valid UTF-8 (byte " + buf + " at offset " + std::to_string(at) + ")");
}

}  // namespace corelm
