// The paragraph-level pieces of `corelm data build`: splitting, whitespace normalisation, the
// quality rules and word-shingle hashing. The rules and thresholds are documented in
// include/corelm/corpus_build.h and docs/TRAINING.md.
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>

#include "corelm/corpus_build.h"
#include "pipeline/corpus_hash.h"

namespace corelm::pipeline {
namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\v' || c == '\r'; }
bool is_blank(std::string_view l) {
  for (unsigned char c : l)
    if (!is_space(c)) return false;
  return true;
}
bool is_alpha(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
bool is_alnum(unsigned char c) { return is_alpha(c) || (c >= '0' && c <= '9'); }
bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }
bool is_symbol(unsigned char c) { return std::strchr("#$%&*<=>@[\\]^_`{|}~", c) != nullptr && c != 0; }

// Surface forms of the most common English words (articles, pronouns, prepositions, auxiliaries).
const std::unordered_set<std::string_view>& stopwords() {
  static const std::unordered_set<std::string_view> words{
      "the", "of",  "and",  "to",   "a",     "in",    "is",   "that", "for",  "it",   "as",   "was",  "with",
      "be",  "by",  "on",   "not",  "he",    "i",     "this", "are",  "or",   "his",  "from", "at",   "which",
      "but", "have", "an",  "they", "you",   "were",  "her",  "she",  "there", "been", "one", "all",  "we",
      "their", "can", "has", "its", "will",  "would", "if",   "so",   "no",   "when", "who",  "them", "do"};
  return words;
}

// The line ends in punctuation that can end (or continue) a sentence.
bool ends_in_punctuation(std::string_view l) {
  if (l.empty()) return false;
  if (std::strchr(".!?:;,)\"']", l.back()) != nullptr && l.back() != 0) return true;
  // Closing curly quotes: U+201D, U+2019 (E2 80 9D / E2 80 99).
  return l.size() >= 3 && static_cast<unsigned char>(l[l.size() - 3]) == 0xE2 &&
         static_cast<unsigned char>(l[l.size() - 2]) == 0x80 &&
         (static_cast<unsigned char>(l.back()) == 0x9D || static_cast<unsigned char>(l.back()) == 0x99);
}

// A '.', '!' or '?' followed by a space or the end of a line.
bool has_sentence_end(const std::vector<std::string>& lines) {
  for (const std::string& l : lines)
    for (size_t i = 0; i < l.size(); ++i)
      if ((l[i] == '.' || l[i] == '!' || l[i] == '?') && (i + 1 == l.size() || l[i + 1] == ' ')) return true;
  return false;
}

// Cut position <= limit that does not split a UTF-8 sequence (and is > 0 when limit > 0).
size_t utf8_cut(std::string_view s, size_t limit) {
  size_t cut = std::min(limit, s.size());
  while (cut > 0 && cut < s.size() && is_continuation(static_cast<unsigned char>(s[cut]))) --cut;
  return cut == 0 ? std::min(limit, s.size()) : cut;
}

}  // namespace

// ---- splitting ----

void ParagraphSplitter::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      pending_line_.append(bytes);
      // A line with no end in sight: cut it into paragraph-sized pieces as it comes.
      while (static_cast<int64_t>(pending_line_.size()) > max_) {
        std::string_view l(pending_line_);
        size_t cut = l.substr(0, static_cast<size_t>(max_)).rfind(' ');
        if (cut == std::string_view::npos || cut == 0) cut = utf8_cut(l, static_cast<size_t>(max_));
        line(l.substr(0, cut));
        flush();
        pending_line_.erase(0, cut);
      }
      return;
    }
    if (pending_line_.empty()) {
      line(bytes.substr(0, nl));
    } else {
      pending_line_.append(bytes.substr(0, nl));
      line(pending_line_);
      pending_line_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

void ParagraphSplitter::finish() {
  if (!pending_line_.empty()) {
    std::string l;
    l.swap(pending_line_);
    line(l);
  }
  flush();
}

void ParagraphSplitter::line(std::string_view l) {
  if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
  if (is_blank(l)) {
    flush();
    return;
  }
  if (!para_.empty() && static_cast<int64_t>(para_.size() + 1 + l.size()) > max_) flush();
  while (static_cast<int64_t>(l.size()) > max_) {  // one line longer than a paragraph may be
    size_t cut = l.substr(0, static_cast<size_t>(max_)).rfind(' ');
    if (cut == std::string_view::npos || cut == 0) cut = utf8_cut(l, static_cast<size_t>(max_));
    para_.assign(l.substr(0, cut));
    flush();
    l.remove_prefix(cut);
  }
  if (!para_.empty()) para_.push_back('\n');
  para_.append(l);
}

void ParagraphSplitter::flush() {
  if (para_.empty()) return;
  std::string p;
  p.swap(para_);
  sink_(std::move(p));
}

// ---- normalisation ----

std::vector<std::string> normalized_lines(std::string_view raw) {
  std::vector<std::string> lines;
  std::string cur;
  bool space = false;
  auto end_line = [&] {
    if (!cur.empty()) lines.push_back(std::move(cur));
    cur.clear();
    space = false;
  };
  for (unsigned char c : raw) {
    if (c == '\n') {
      end_line();
    } else if (is_space(c)) {
      space = !cur.empty();
    } else if (c < 0x20 || c == 0x7F) {
      // other control characters (backspace overstrikes, escapes) carry no text
    } else {
      if (space) cur.push_back(' ');
      space = false;
      cur.push_back(static_cast<char>(c));
    }
  }
  end_line();
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines, bool keep_lines) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out.push_back(keep_lines ? '\n' : ' ');
    out += lines[i];
  }
  return out;
}

// ---- quality rules ----

std::string quality_verdict(const std::vector<std::string>& lines, const QualityThresholds& t) {
  int64_t nonspace = 0, letters = 0, symbols = 0, words = 0, word_chars = 0, stop = 0;
  std::string lower;
  for (const std::string& l : lines) {
    size_t i = 0;
    while (i < l.size()) {
      while (i < l.size() && l[i] == ' ') ++i;
      const size_t start = i;
      while (i < l.size() && l[i] != ' ') ++i;
      if (i == start) break;
      std::string_view w(l.data() + start, i - start);
      for (unsigned char c : w) {
        if (is_continuation(c)) continue;  // count code points
        ++nonspace;
        if (is_alpha(c)) ++letters;
        else if (is_symbol(c)) ++symbols;
      }
      // The word without leading/trailing ASCII punctuation.
      size_t a = 0, b = w.size();
      while (a < b && static_cast<unsigned char>(w[a]) < 0x80 && !is_alnum(static_cast<unsigned char>(w[a]))) ++a;
      while (b > a && static_cast<unsigned char>(w[b - 1]) < 0x80 && !is_alnum(static_cast<unsigned char>(w[b - 1]))) --b;
      if (a == b) continue;
      ++words;
      for (size_t k = a; k < b; ++k) word_chars += !is_continuation(static_cast<unsigned char>(w[k]));
      lower.assign(w.substr(a, b - a));
      for (char& c : lower) c = static_cast<char>((c >= 'A' && c <= 'Z') ? c + 32 : c);
      stop += stopwords().count(lower) ? 1 : 0;
    }
  }
  if (nonspace == 0 || static_cast<double>(letters) / nonspace < t.min_letter_ratio) return "letters";
  if (static_cast<double>(symbols) / nonspace > t.max_symbol_ratio) return "symbols";
  const double mean_word = words ? static_cast<double>(word_chars) / words : 0;
  if (mean_word < t.min_mean_word || mean_word > t.max_mean_word) return "word_length";
  if (static_cast<double>(stop) / words < t.min_stopword_ratio) return "stopwords";
  int64_t good_ends = 0, repeated = 0;
  std::unordered_set<std::string_view> seen;
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool wraps = i + 1 < lines.size() && !lines[i + 1].empty() && lines[i + 1][0] >= 'a' && lines[i + 1][0] <= 'z';
    good_ends += ends_in_punctuation(lines[i]) || wraps;
    repeated += seen.insert(lines[i]).second ? 0 : 1;
  }
  const double n = static_cast<double>(lines.size());
  // Prose has a sentence end somewhere; lists, menus and listings have many lines that neither
  // end nor continue a sentence (one or two lines say too little to judge by line).
  if (!has_sentence_end(lines) || (lines.size() >= 3 && good_ends / n < t.min_line_end_ratio)) return "line_ends";
  if (repeated / n > t.max_repeated_line_ratio) return "repeated_lines";
  return "";
}

// ---- shingles ----

uint64_t paragraph_hash(std::string_view text) { return hash_bytes(text, 0x5bd1e9955bd1e995ull); }

std::vector<uint64_t> shingles(std::string_view text) {
  std::vector<uint64_t> words;
  std::string w;
  auto end_word = [&] {
    if (!w.empty()) words.push_back(hash_bytes(w, 0x2545f4914f6cdd1dull));
    w.clear();
  };
  for (unsigned char c : text) {
    if (is_alnum(c) || c >= 0x80) w.push_back(static_cast<char>((c >= 'A' && c <= 'Z') ? c + 32 : c));
    else end_word();
  }
  end_word();
  std::vector<uint64_t> out;
  if (words.empty()) return out;
  constexpr size_t kN = 5;
  const size_t n = words.size() < kN ? 1 : words.size() - kN + 1;
  const size_t width = std::min(kN, words.size());
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t k = 0; k < width; ++k) h = mix64(h ^ words[i + k]) + k;
    out.push_back(h);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  if (a.empty() && b.empty()) return 1;
  size_t i = 0, j = 0, common = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) ++i;
    else if (b[j] < a[i]) ++j;
    else ++common, ++i, ++j;
  }
  return static_cast<double>(common) / static_cast<double>(a.size() + b.size() - common);
}

}  // namespace corelm::pipeline
