// GPT-2's byte-to-unicode table: byte-level BPE files spell every byte as a printable code point
// (printable ASCII and most of Latin-1 stand for themselves, the other 68 bytes for U+0100..).
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace corelm::tok {

// The code point that spells byte b.
uint32_t byte_to_unicode(unsigned char b);
// The bytes a byte-level spelled token stands for; nullopt if it holds a code point outside the
// table (then it is not a byte-level token, e.g. a special token written verbatim).
std::optional<std::string> byte_level_decode(std::string_view spelled);
// The byte-level spelling of raw bytes (used when writing tokenizer.json files).
std::string byte_level_encode(std::string_view bytes);

}  // namespace corelm::tok
