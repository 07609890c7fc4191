// Fuzz target: arbitrary bytes through the paragraph pieces of `corelm data build` (splitter,
// whitespace normalisation, quality rules, shingles). The input is fed in pieces whose sizes come
// from the data itself, so lines and paragraphs span feeds. Invariants: no paragraph exceeds the
// byte limit, no byte other than whitespace is lost, normalised lines are trimmed with single
// spaces, every verdict is a known rule, and a text's shingle set is sorted, unique and at
// Jaccard 1 with itself. Seeds: any text (a few lines and blank lines are enough).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "corelm/corpus_build.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace corelm::pipeline;
  if (size < 1) return 0;
  constexpr int64_t kMax = 256;
  const size_t step = 1 + data[0] % 64;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  static const std::set<std::string> rules{"", "letters", "symbols", "word_length", "stopwords", "line_ends",
                                           "repeated_lines"};
  // Whitespace may go (blank lines, '\r' before '\n', a cut long line's blank piece); nothing else.
  auto is_ws = [](char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\v' || c == '\r' || c == '\n'; };
  uint64_t kept_bytes = 0;
  ParagraphSplitter splitter(kMax, [&](std::string&& p) {
    if (p.empty() || static_cast<int64_t>(p.size()) > kMax) std::abort();
    for (char c : p) kept_bytes += !is_ws(c);
    const std::vector<std::string> lines = normalized_lines(p);
    for (const std::string& l : lines) {
      if (l.empty() || l.front() == ' ' || l.back() == ' ' || l.find("  ") != std::string::npos) std::abort();
    }
    if (!rules.count(quality_verdict(lines, QualityThresholds{}))) std::abort();
    const std::string joined = join_lines(lines, false);
    const std::vector<uint64_t> sh = shingles(joined);
    if (!std::is_sorted(sh.begin(), sh.end()) || std::adjacent_find(sh.begin(), sh.end()) != sh.end()) std::abort();
    if (!sh.empty() && jaccard(sh, sh) != 1.0) std::abort();
  });
  for (size_t pos = 0; pos < text.size(); pos += step) splitter.feed(std::string_view(text).substr(pos, step));
  splitter.finish();
  const uint64_t expected = static_cast<uint64_t>(std::count_if(text.begin(), text.end(), [&](char c) { return !is_ws(c); }));
  if (kept_bytes != expected) std::abort();
  return 0;
}
