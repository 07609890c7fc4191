// Constrained decoding: the output must follow a grammar (a regex, one of a list of strings, any
// JSON object, or a JSON Schema subset). A Grammar is compiled once and shared (immutable,
// thread-safe); each generated sequence keeps a TokenConstraint that masks the logits of tokens
// which would make the output impossible to complete, and forces completion when the token
// budget runs short, so a finished output always parses / matches (finish_reason "stop").
// Used by the pipeline's extract task and by the serving scheduler (one engine for both).
// See docs/CONSTRAINED-DECODING.md for the supported JSON Schema subset, limits and costs.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/tokenizer.h"

namespace corelm::infer {

// Byte-level automaton state of one output. Copyable through clone().
class GrammarState {
 public:
  virtual ~GrammarState() = default;
  virtual std::unique_ptr<GrammarState> clone() const = 0;
  // Feeds bytes; false when no continuation of the output can be accepted any more (the state is
  // then unspecified and must not be used).
  virtual bool advance(std::string_view bytes) = 0;
  // The output so far is a complete match (EOS may end it here).
  virtual bool accepts() const = 0;
  // Some non-empty continuation can still be accepted.
  virtual bool can_continue() const = 0;
  // Fewest bytes that complete the output from here (0 when accepts()); forcing uses it.
  virtual int64_t min_bytes_to_accept() const = 0;
  // The byte values that may come next (256 flags), for forcing and for the vocabulary walk.
  virtual void next_bytes(bool out[256]) const = 0;
};

class Grammar {
 public:
  virtual ~Grammar() = default;
  virtual std::unique_ptr<GrammarState> start() const = 0;
  virtual std::string describe() const = 0;  // "regex ...", "choices [..]", "json_object", "json_schema"

  // ValueError naming the position / schema path at fault for anything unsupported.
  static std::shared_ptr<const Grammar> regex(const std::string& pattern);
  static std::shared_ptr<const Grammar> choices(const std::vector<std::string>& choices);
  static std::shared_ptr<const Grammar> json_object();  // any JSON object (nesting bounded, see docs)
  // Properties are emitted in the schema's key order: pass an ordered_json to keep the order the
  // schema was written in (a plain json iterates its keys sorted).
  static std::shared_ptr<const Grammar> json_schema(const nlohmann::json& schema);
  static std::shared_ptr<const Grammar> json_schema(const nlohmann::ordered_json& schema);
};

// Per sequence: the grammar applied to a tokenizer's vocabulary.
class TokenConstraint {
 public:
  // The vocabulary index (a byte trie of every token) is built once per tokenizer and cached
  // (thread-safe); `tokenizer` must outlive the constraint.
  TokenConstraint(std::shared_ptr<const Grammar> grammar, const Tokenizer& tokenizer, std::vector<TokenId> eos_ids);
  ~TokenConstraint();
  TokenConstraint(TokenConstraint&&) noexcept;
  TokenConstraint& operator=(TokenConstraint&&) noexcept;
  TokenConstraint clone() const;  // same grammar, same state (n > 1 choices share the prompt)

  // Sets to -inf the logits of every token that cannot be part of a completable output (special
  // tokens always; EOS ids unless the output is complete). When `remaining_tokens` (the token
  // budget left, counting this one) is not enough to finish otherwise, only tokens that bring the
  // output closer to completion survive. Leaves at least one token finite whenever !finished().
  void mask(std::span<float> logits, int64_t remaining_tokens) const;
  // Advances by the chosen token; ValueError if mask() would have removed it.
  void accept(TokenId token);
  bool complete() const;  // the output so far is a full match
  bool finished() const;  // complete and nothing can extend it: stop without waiting for EOS

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace corelm::infer
