// UTF-8 checks for text that crosses an edge (file names, labels, templates, metadata strings)
// before it reaches JSON output, which must be valid UTF-8: validate and name the field, or
// escape the invalid bytes visibly. The tokenizer's own decoding lives in src/tokenizer/unicode.h.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace corelm {

// Offset of the first byte that does not start a valid, shortest-form UTF-8 sequence
// (std::string_view::npos when s is valid UTF-8).
size_t first_invalid_utf8(std::string_view s);
inline bool valid_utf8(std::string_view s) { return first_invalid_utf8(s) == std::string_view::npos; }

// s with each byte of an invalid sequence written as the four characters "\xNN" (valid UTF-8
// that still shows the bytes, e.g. for a file name in a manifest).
std::string escape_invalid_utf8(std::string_view s);

// Throws ValueError "<what> is not valid UTF-8 (byte 0xNN at offset K)" when s is not.
void require_utf8(std::string_view s, const std::string& what);

}  // namespace corelm
