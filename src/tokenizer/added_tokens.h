// Added tokens (special or not) are found in the raw text before any pre-tokenization, leftmost
// then longest, as Hugging Face does. A byte trie keeps the scan linear even with hundreds of
// reserved special tokens that share the "<|" prefix.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace corelm::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;  // the match swallows whitespace on its left
  bool rstrip = false;  // ... and on its right
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  struct Match {
    size_t begin = 0, end = 0;  // the bytes the token replaces (incl. stripped whitespace)
    int32_t id = -1;
  };
  // The first match at or after `from` (only non-special tokens unless allow_special); id -1 if none.
  Match next(std::string_view text, size_t from, bool allow_special) const;
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_
  };
  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace corelm::tok
