// What the grammars (regex, choices, JSON) share with the vocabulary walk of TokenConstraint:
// states that copy without allocating once warm and that name themselves with a key, so a mask
// computed for one state is reused whenever the same state comes back.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "corelm/constraint.h"

namespace corelm::infer::constraint {

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

  bool advance(std::string_view bytes) override {
    for (unsigned char c : bytes)
      if (!step(c)) return false;
    return true;
  }
};

// The JSON Schema subset compiled to a regular expression (constraint_schema.cc).
std::string schema_to_regex(const nlohmann::json& schema);
std::string schema_to_regex(const nlohmann::ordered_json& schema);

}  // namespace corelm::infer::constraint
