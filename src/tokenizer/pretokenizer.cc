#include "tokenizer/pretokenizer.h"

#include "tokenizer/unicode.h"

namespace corelm::tok {
namespace {

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline bool is_ws(uint8_t c) { return c == kSpace || c == kNewline; }

// Decodes text into code-point start offsets (plus a final sentinel) and classes.
size_t decode(std::string_view text, PretokScratch& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  s.offsets.resize(n + 1);
  s.classes.resize(n + 1);
  static const uint8_t* ascii = [] {
    static uint8_t t[128];
    for (uint32_t c = 0; c < 128; ++c) t[c] = cp_class(c);
    return t;
  }();
  size_t count = 0, i = 0;
  while (i < n) {
    s.offsets[count] = static_cast<uint32_t>(i);
    if (p[i] < 0x80) {
      s.classes[count++] = ascii[p[i]];
      ++i;
      continue;
    }
    int len;
    uint32_t cp = decode_utf8(p + i, n - i, &len);
    s.classes[count++] = cp_class(cp);
    i += len;
  }
  s.offsets[count] = static_cast<uint32_t>(n);
  s.classes[count] = kOther;
  return count;
}

// Length in code points of a contraction ('s 't 're 've 'm 'll 'd) starting at the apostrophe at
// cp index i, or 0. Case-insensitive matching follows Unicode simple case folding, under which
// U+017F LATIN SMALL LETTER LONG S matches 's' as well.
size_t contraction(std::string_view text, const PretokScratch& s, size_t i, size_t n, bool ignore_case) {
  auto byte_at = [&](size_t k) -> int {  // ASCII byte of cp k, folded if requested, else -1
    if (k >= n) return -1;
    uint32_t off = s.offsets[k];
    if (s.offsets[k + 1] - off == 2 && ignore_case && static_cast<unsigned char>(text[off]) == 0xC5 &&
        static_cast<unsigned char>(text[off + 1]) == 0xBF)
      return 's';  // U+017F
    if (s.offsets[k + 1] - off != 1) return -1;
    int c = static_cast<unsigned char>(text[off]);
    if (ignore_case && c >= 'A' && c <= 'Z') c += 'a' - 'A';
    return c;
  };
  int a = byte_at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  int b = byte_at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

inline bool is_apostrophe(std::string_view text, const PretokScratch& s, size_t i) {
  return s.offsets[i + 1] - s.offsets[i] == 1 && text[s.offsets[i]] == '\'';
}
inline bool is_space_char(std::string_view text, const PretokScratch& s, size_t i) {
  return s.offsets[i + 1] - s.offsets[i] == 1 && text[s.offsets[i]] == ' ';
}

void split_gpt2(std::string_view text, PretokScratch& s, size_t n, std::vector<Span>& out) {
  const uint8_t* cls = s.classes.data();
  auto emit = [&](size_t a, size_t b) { out.push_back({s.offsets[a], s.offsets[b]}); };
  size_t i = 0;
  while (i < n) {
    uint8_t c = cls[i];
    if (c == kOther && is_apostrophe(text, s, i)) {
      if (size_t k = contraction(text, s, i, n, false)) { emit(i, i + k); i += k; continue; }
    }
    if (!is_ws(c)) {  // \p{L}+ | \p{N}+ | [^\s\p{L}\p{N}]+ (kOther runs)
      size_t j = i + 1;
      while (j < n && cls[j] == c) ++j;
      emit(i, j); i = j; continue;
    }
    if (i + 1 < n && !is_ws(cls[i + 1]) && is_space_char(text, s, i)) {  // " ?X+" with the space
      uint8_t t = cls[i + 1];
      size_t j = i + 2;
      while (j < n && cls[j] == t) ++j;
      emit(i, j); i = j; continue;
    }
    size_t j = i + 1;  // whitespace run [i, j)
    while (j < n && is_ws(cls[j])) ++j;
    if (j == n) { emit(i, n); i = n; continue; }          // \s+(?!\S) at the end
    if (j - i >= 2) { emit(i, j - 1); i = j - 1; continue; }  // \s+(?!\S) leaves one for the next
    emit(i, i + 1); i += 1;                                // \s+
  }
}

void split_llama(std::string_view text, PretokScratch& s, size_t n, size_t max_digits, std::vector<Span>& out) {
  const uint8_t* cls = s.classes.data();
  auto emit = [&](size_t a, size_t b) { out.push_back({s.offsets[a], s.offsets[b]}); };
  size_t i = 0;
  while (i < n) {
    uint8_t c = cls[i];
    if (c == kOther && is_apostrophe(text, s, i)) {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
      if (size_t k = contraction(text, s, i, n, true)) { emit(i, i + k); i += k; continue; }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c == kLetter || ((c == kOther || c == kSpace) && i + 1 < n && cls[i + 1] == kLetter)) {
      size_t j = i + 1;
      while (j < n && cls[j] == kLetter) ++j;
      emit(i, j); i = j; continue;
    }
    if (c == kNumber) {  // \p{N}{1,3} or \p{N}
      size_t j = i + 1;
      while (j < n && cls[j] == kNumber && j - i < max_digits) ++j;
      emit(i, j); i = j; continue;
    }
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"
    if (c == kOther || (i + 1 < n && cls[i + 1] == kOther && is_space_char(text, s, i))) {
      size_t j = c == kOther ? i + 1 : i + 2;
      while (j < n && cls[j] == kOther) ++j;
      while (j < n && cls[j] == kNewline) ++j;
      emit(i, j); i = j; continue;
    }
    size_t j = i + 1;  // whitespace run [i, j)
    while (j < n && is_ws(cls[j])) ++j;
    size_t last_newline = SIZE_MAX;
    for (size_t k = j; k-- > i;) {
      if (cls[k] == kNewline) { last_newline = k; break; }
    }
    if (last_newline != SIZE_MAX) { emit(i, last_newline + 1); i = last_newline + 1; continue; }  // \s*[\r\n]+
    if (j == n) { emit(i, n); i = n; continue; }              // \s+(?!\S) at the end
    if (j - i >= 2) { emit(i, j - 1); i = j - 1; continue; }  // \s+(?!\S)
    emit(i, i + 1); i += 1;                                   // \s+
  }
}

}  // namespace

bool pattern_from_regex(std::string_view regex, SplitPattern* out) {
  if (regex == kGpt2Regex) { *out = SplitPattern::kGpt2; return true; }
  if (regex == kLlama3Regex) { *out = SplitPattern::kLlama3; return true; }
  if (regex == kQwen2Regex) { *out = SplitPattern::kQwen2; return true; }
  return false;
}

const char* regex_of(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2: return kGpt2Regex;
    case SplitPattern::kLlama3: return kLlama3Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
  }
  return kGpt2Regex;
}

const char* name_of(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2: return "gpt2";
    case SplitPattern::kLlama3: return "llama3";
    case SplitPattern::kQwen2: return "qwen2";
  }
  return "?";
}

void split_pattern(SplitPattern pattern, std::string_view text, PretokScratch& scratch, std::vector<Span>& out) {
  size_t n = decode(text, scratch);
  switch (pattern) {
    case SplitPattern::kGpt2: split_gpt2(text, scratch, n, out); break;
    case SplitPattern::kLlama3: split_llama(text, scratch, n, 3, out); break;
    case SplitPattern::kQwen2: split_llama(text, scratch, n, 1, out); break;
  }
}

void split_digits(bool individual, std::string_view text, std::vector<Span>& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size(), i = 0, start = 0;
  bool prev_num = false;
  while (i < n) {
    int len;
    uint32_t cp = decode_utf8(p + i, n - i, &len);
    bool num = cp_class(cp) == kNumber;
    if (i > start && (num != prev_num || (num && individual))) {
      out.push_back({start, i});
      start = i;
    }
    prev_num = num;
    i += len;
  }
  if (n > start) out.push_back({start, n});
}

}  // namespace corelm::tok
