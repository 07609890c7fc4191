#include "tokenizer/added_tokens.h"

#include <cstring>

namespace corelm::tok {
namespace {
bool is_ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  nodes_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& s = tokens_[t].content;
    if (s.empty()) continue;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (unsigned char c : s) {
      int32_t child = -1;
      for (auto& [byte, idx] : nodes_[node].children)
        if (byte == c) { child = idx; break; }
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.push_back({c, child});
        nodes_.emplace_back();
      }
      node = child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
  }
}

AddedTokenMatcher::Match AddedTokenMatcher::next(std::string_view text, size_t from, bool allow_special) const {
  Match m;
  if (tokens_.empty()) return m;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  for (size_t i = from; i < n; ++i) {
    if (!first_byte_[p[i]]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < n; ++j) {
      int32_t child = -1;
      for (auto& [byte, idx] : nodes_[node].children)
        if (byte == p[j]) { child = idx; break; }
      if (child < 0) break;
      node = child;
      int32_t t = nodes_[node].token;
      if (t >= 0 && (allow_special || !tokens_[t].special)) { best = t; best_end = j + 1; }
    }
    if (best < 0) continue;
    const AddedToken& tok = tokens_[best];
    m.begin = i;
    m.end = best_end;
    m.id = tok.id;
    if (tok.lstrip)
      while (m.begin > from && is_ascii_space(p[m.begin - 1])) --m.begin;
    if (tok.rstrip)
      while (m.end < n && is_ascii_space(p[m.end])) ++m.end;
    return m;
  }
  return m;
}

}  // namespace corelm::tok
