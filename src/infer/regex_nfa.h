// A small regular-expression engine for constrained decoding: the constraint keeps only tokens
// after which the output can still become a full match, so it needs "is this a viable prefix?",
// which std::regex cannot answer. Bytes, not code points. Supported syntax:
//   literals, '.' (any byte but '\n'), classes [abc] [a-z] [^...], escapes \d \w \s \D \W \S and
//   escaped metacharacters (\. \( \\ ...), \n \t \r, groups ( ), alternation |, quantifiers * + ?
//   {m} {m,} {m,n} (n <= 1000). The whole output must match (implicit ^...$). No backreferences,
//   lookaround, lazy quantifiers or anchors inside the pattern. Bytes >= 0x80 in the pattern are
//   literal bytes (the JSON Schema compiler spells UTF-8 ranges that way).
// The NFA is bounded (max_nodes, at most kMaxNodes) so a hostile pattern such as (a{1000}){1000} is a ValueError,
// not an allocation of gigabytes.
#pragma once
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace corelm::infer {

class Regex {
 public:
  using State = std::vector<int>;  // a set of NFA states (sorted); empty = dead
  static constexpr size_t kMaxNodes = 400000;

  // ValueError naming `what` (the option or field the pattern came from) and the position at fault,
  // or saying the automaton would exceed `max_nodes` states.
  static Regex compile(const std::string& pattern, const std::string& what = "regex", size_t max_nodes = kMaxNodes);
  State start() const;
  // Feeds bytes; false (and `state` dead) when no continuation can match any more.
  bool advance(State& state, std::string_view bytes) const;
  bool step(State& state, unsigned char byte) const;  // advance by one byte
  bool accepts(const State& state) const;
  bool can_continue(const State& state) const;  // some byte is viable next
  // Fewest bytes that complete a match from `state` (0 when it accepts).
  int64_t min_bytes_to_accept(const State& state) const;
  void next_bytes(const State& state, bool out[256]) const;
  size_t size() const { return nodes_.size(); }

 private:
  struct Node {
    std::bitset<256> bytes;  // a consuming state when `split` is false and it is not the match
    bool split = false, match = false;
    int out1 = -1, out2 = -1;
  };
  void closure(State& s) const;
  std::vector<Node> nodes_;
  std::vector<bool> live_;     // can reach the match state
  std::vector<int64_t> dist_;  // fewest bytes from the node to the match
  int start_ = -1;
  size_t max_nodes_ = kMaxNodes;
  friend class RegexCompiler;
};

}  // namespace corelm::infer
