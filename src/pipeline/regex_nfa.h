// A small regular-expression engine for constrained decoding: the extract task keeps only tokens
// after which the output can still become a full match, so it needs "is this a viable prefix?",
// which std::regex cannot answer. Bytes, not code points. Supported syntax:
//   literals, '.' (any byte but '\n'), classes [abc] [a-z] [^...], escapes \d \w \s \D \W \S and
//   escaped metacharacters (\. \( \\ ...), \n \t, groups ( ), alternation |, quantifiers * + ?
//   {m} {m,} {m,n} (n <= 1000). The whole output must match (implicit ^...$). No backreferences,
//   lookaround, lazy quantifiers or anchors inside the pattern.
#pragma once
#include <bitset>
#include <string>
#include <string_view>
#include <vector>

namespace corelm::pipeline {

class Regex {
 public:
  using State = std::vector<int>;  // a set of NFA states (sorted); empty = dead

  static Regex compile(const std::string& pattern);  // ValueError naming the position at fault
  State start() const;
  // Feeds bytes; false (and `state` dead) when no continuation can match any more.
  bool advance(State& state, std::string_view bytes) const;
  bool accepts(const State& state) const;

 private:
  struct Node {
    std::bitset<256> bytes;  // a consuming state when `split` is false and it is not the match
    bool split = false, match = false;
    int out1 = -1, out2 = -1;
  };
  void closure(State& s) const;
  std::vector<Node> nodes_;
  std::vector<bool> live_;  // can reach the match state
  int start_ = -1;
  friend class RegexCompiler;
};

}  // namespace corelm::pipeline
