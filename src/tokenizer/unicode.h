// UTF-8 decoding, the code-point classes the pre-tokenizer patterns use (\p{L}, \p{N}, \s), and
// NFC normalization. Invalid UTF-8 never throws here: each byte that does not begin a valid,
// shortest-form sequence is one unit of its own (class kOther), which keeps the byte-level
// tokenizers total and lets every byte round-trip.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace corelm::tok {

enum CpClass : uint8_t {
  kOther = 0,    // anything that is not a letter, number or whitespace (incl. marks, invalid bytes)
  kLetter = 1,   // \p{L}
  kNumber = 2,   // \p{N}
  kSpace = 3,    // \s except \r and \n (Unicode White_Space)
  kNewline = 4,  // \r or \n
};

// Code points above this value stand for one invalid byte (kInvalidBase + byte).
inline constexpr uint32_t kInvalidBase = 0x110000;

// Decodes the unit at p[0..n) (n >= 1); returns its code point and sets *len to its byte length.
inline uint32_t decode_utf8(const unsigned char* p, size_t n, int* len) {
  unsigned c = p[0];
  if (c < 0x80) { *len = 1; return c; }
  *len = 1;
  if (c < 0xC2) return kInvalidBase + c;  // continuation byte or overlong 2-byte lead
  if (c < 0xE0) {
    if (n < 2 || (p[1] & 0xC0) != 0x80) return kInvalidBase + c;
    *len = 2;
    return ((c & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (c < 0xF0) {
    if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return kInvalidBase + c;
    uint32_t cp = ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidBase + c;
    *len = 3;
    return cp;
  }
  if (c < 0xF5) {
    if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return kInvalidBase + c;
    uint32_t cp = ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    if (cp < 0x10000 || cp > 0x10FFFF) return kInvalidBase + c;
    *len = 4;
    return cp;
  }
  return kInvalidBase + c;
}

// Class of a code point (or of an invalid-byte unit: kOther).
CpClass cp_class(uint32_t cp);

void append_utf8(std::string& out, uint32_t cp);
bool is_valid_utf8(std::string_view s);
// Length of the longest prefix of s that does not end inside a (possibly still valid) incomplete
// UTF-8 sequence: the streaming decoder holds back the rest.
size_t complete_utf8_prefix(std::string_view s);
// Valid UTF-8 copy of s: each maximal invalid subsequence becomes U+FFFD (as Python's
// bytes.decode(errors="replace") and Rust's from_utf8_lossy do).
std::string to_valid_utf8(std::string_view s);

// Unicode NFC. Invalid bytes are kept as they are; the valid stretches between them are normalized.
std::string nfc(std::string_view s);

}  // namespace corelm::tok
