// Hand-written pre-tokenizers for the regex patterns GPT-2, Llama-3 and Qwen2 use. Each walks the
// code points once with the class table, which is several times faster than a general regex
// engine and gives exactly the regex's leftmost-first matches (the rules are spelled out in
// pretokenizer.cc next to each alternative).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace corelm::tok {

enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // as kLlama3 with \p{N} (single digits)
};

// The exact regex strings as they appear in tokenizer.json files; returns false when unknown.
bool pattern_from_regex(std::string_view regex, SplitPattern* out);
const char* regex_of(SplitPattern p);
const char* name_of(SplitPattern p);

struct Span {
  size_t begin, end;  // byte offsets
};

// Reusable scratch space (code-point offsets and classes) so splitting allocates nothing per call.
struct PretokScratch {
  std::vector<uint32_t> offsets;
  std::vector<uint8_t> classes;
};

// Appends the pre-tokens of `text` to `out` as byte spans (offsets relative to text).
void split_pattern(SplitPattern pattern, std::string_view text, PretokScratch& scratch, std::vector<Span>& out);

// Hugging Face's Digits pre-tokenizer: numbers (\p{N}) isolated, one per digit or as runs.
void split_digits(bool individual, std::string_view text, std::vector<Span>& out);

}  // namespace corelm::tok
