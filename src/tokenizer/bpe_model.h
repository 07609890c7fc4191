// The BPE model proper: token byte strings, ranked merges, and the merge loop. Works on raw bytes:
// byte-level files spell tokens through the GPT-2 byte-to-unicode table, which the loader undoes,
// so pre-tokens never need re-spelling on the hot path.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/flat_map.h"

namespace corelm::tok {

class BpeModel {
 public:
  // `tokens[id]` are the bytes of token id (ids without a token hold an empty string and are never
  // produced). merges are (left id, right id, merged id) in rank order.
  struct MergeRule {
    int32_t left, right, merged;
  };
  // `unk_id` (-1: none) stands for a byte without a single-byte token, one per such byte or one
  // per run of them with `fuse_unk`; without it such bytes are dropped before merging.
  BpeModel(std::vector<std::string> tokens, const std::vector<MergeRule>& merges, bool ignore_merges,
           const std::string& source, int32_t unk_id = -1, bool fuse_unk = false);

  // Appends the ids of one pre-token. A byte the vocabulary has no single-byte token for (many
  // real byte-level vocabularies lack a few, e.g. 0xC0, 0xC1, 0xF5..0xFF that UTF-8 never uses)
  // is what Hugging Face tokenizers makes of it: the unknown token when the model names one, else
  // nothing, its neighbours then merging as if it were not there.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  int missing_bytes() const { return missing_bytes_; }  // bytes without a single-byte token

  size_t size() const { return tokens_.size(); }
  std::string_view token(int32_t id) const { return tokens_[id]; }
  int32_t find(std::string_view bytes) const { return vocab_.find(bytes); }
  bool ignore_merges() const { return ignore_merges_; }
  size_t merge_count() const { return merge_count_; }
  const std::vector<MergeRule>& merge_rules() const { return merge_rules_; }

  // The plain merge loop without the whole-token shortcut (tests compare the two).
  void merge_loop(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  void encode_uncached(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const;
  void merge_small(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_heap(std::string_view piece, std::vector<int32_t>& out) const;
  bool reachable(int32_t id) const;
  // The initial symbols of a piece: one per byte, with missing bytes mapped to unk or dropped.
  // Returns how many were written to `sym` (room for piece.size()).
  size_t initial_symbols(std::string_view piece, int32_t* sym) const;

  std::vector<std::string> tokens_;
  std::vector<MergeRule> merge_rules_;
  StringIdMap vocab_;
  PairMap merges_;
  int32_t byte_id_[256];  // -1 for a byte without a single-byte token
  int missing_bytes_ = 0;
  int32_t unk_id_;
  bool fuse_unk_;
  bool ignore_merges_;
  size_t merge_count_;
  uint64_t serial_;  // identifies this model to the per-thread caches
  // Per token: 0 = not yet known, 1 = the merges rebuild the token from its bytes, 2 = they do
  // not (then a whole pre-token equal to it must still go through the merge loop).
  mutable std::unique_ptr<std::atomic<uint8_t>[]> reachable_;
};

}  // namespace corelm::tok
