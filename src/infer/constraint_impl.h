// What the grammars (regex, choices, JSON) share with the vocabulary walk of TokenConstraint:
// states that copy without allocating once warm and that name themselves with a key, so a mask
// computed for one state is reused whenever the same state comes back.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "corelm/constraint.h"

namespace corelm::infer::constraint {

// Every usable token of a vocabulary as a byte trie (special, empty and over-long tokens left
// out); a node's edges are contiguous and sorted by byte.
struct VocabIndex {
  struct Node {
    uint32_t edge_begin = 0, edge_end = 0, tok_begin = 0, tok_end = 0;
  };
  size_t vocab = 0;
  uint64_t fingerprint = 0;
  std::vector<Node> nodes;
  std::vector<unsigned char> edge_byte;
  std::vector<uint32_t> edge_child;
  std::vector<TokenId> toks;
  std::vector<char> special;  // per id: special tokens are never allowed (EOS ids aside)
  size_t depth = 0;           // longest token in the trie
};

// Called for every trie token whose bytes keep the state alive, with min_bytes_to_accept after it.
using TokenSink = void (*)(void* ctx, TokenId token, int64_t after);

class StateImpl;
void walk_generic(const StateImpl& root, const VocabIndex& ix, void* ctx, TokenSink sink);

class StateImpl : public GrammarState {
 public:
  // `other` has the same concrete type (a state of the same grammar).
  virtual void assign_from(const StateImpl& other) = 0;
  virtual bool step(unsigned char byte) = 0;
  // A byte string that identifies the state within its grammar; empty when the grammar cannot
  // tell (the mask is then never cached).
  virtual void key(std::string& out) const = 0;
  // next_bytes() is cheap enough to prune every trie node with (otherwise the walk just steps).
  virtual bool cheap_next_bytes() const { return false; }
  // The vocabulary walk from this state; grammars override it with walk_trie<TheirState> so the
  // per-edge copy and step are direct calls.
  virtual void walk(const VocabIndex& ix, void* ctx, TokenSink sink) const { walk_generic(*this, ix, ctx, sink); }

  bool advance(std::string_view bytes) override {
    for (unsigned char c : bytes)
      if (!step(c)) return false;
    return true;
  }
};

// Depth-first walk of the trie, stepping a copy of the state per edge and skipping dead
// subtrees. at(d) is the state at depth d, a scratch stack the walk overwrites (at(0): the root).
template <class At>
void walk_stack(At at, const VocabIndex& ix, void* ctx, TokenSink sink) {
  auto visit = [&](auto& self, uint32_t node, size_t d) -> void {
    const VocabIndex::Node& n = ix.nodes[node];
    auto& here = at(d);
    if (n.tok_begin != n.tok_end) {
      const int64_t after = here.min_bytes_to_accept();
      for (uint32_t k = n.tok_begin; k < n.tok_end; ++k) sink(ctx, ix.toks[k], after);
    }
    if (n.edge_begin == n.edge_end) return;
    bool next[256];
    const bool prune = here.cheap_next_bytes();
    if (prune) here.next_bytes(next);
    auto& child = at(d + 1);
    for (uint32_t e = n.edge_begin; e < n.edge_end; ++e) {
      const unsigned char b = ix.edge_byte[e];
      if (prune && !next[b]) continue;
      child.assign_from(here);
      if (child.step(b)) self(self, ix.edge_child[e], d + 1);
    }
  };
  visit(visit, 0, 0);
}

// The walk from `root`. T is a final state type, so its calls are not virtual.
template <class T>
void walk_trie(const T& root, const VocabIndex& ix, void* ctx, TokenSink sink) {
  std::vector<T> st(ix.depth + 1, root);
  walk_stack([&st](size_t d) -> T& { return st[d]; }, ix, ctx, sink);
}

// The JSON Schema subset compiled to a regular expression (constraint_schema.cc).
std::string schema_to_regex(const nlohmann::json& schema);
std::string schema_to_regex(const nlohmann::ordered_json& schema);

}  // namespace corelm::infer::constraint
