// The regex and choices grammars (and json_schema, which compiles to a regex).
#include <algorithm>
#include <bitset>
#include <cstring>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "corelm/error.h"
#include "infer/constraint_impl.h"
#include "infer/regex_nfa.h"

namespace corelm::infer {
namespace constraint {
namespace {

// The regex's NFA determinised lazily: each set of NFA states met is interned once as a DFA
// node (its acceptance, distance and viable bytes precomputed) and each transition is computed
// once, so the vocabulary walk costs a hash lookup per trie edge instead of an NFA step. Shared
// by every sequence and thread using the grammar (nodes are immutable once made; the maps are
// guarded). Bounded: past kMaxNodes nodes, kMaxSetInts NFA states in all or kMaxTrans
// transitions, states go on as plain NFA sets (correct, just slower).
struct DfaNode {
  Regex::State set;
  int64_t dist = 0;
  bool accepts = false, cont = false;
  std::bitset<256> next;
  uint32_t id = 0;
};

class LazyDfa {
 public:
  static constexpr size_t kMaxNodes = 65536, kMaxSetInts = size_t{4} << 20, kMaxTrans = size_t{1} << 20;

  explicit LazyDfa(const Regex& re) : re_(re) { start_ = find_or_add(re.start()); }
  const DfaNode* start() const { return start_; }
  const DfaNode* dead() const { return &dead_; }

  // The node after `b`: dead() when nothing can match any more, nullptr when the DFA is full
  // (then `raw` holds the NFA set).
  const DfaNode* step(const DfaNode* from, unsigned char b, Regex::State& raw) const {
    const uint64_t key = (uint64_t{from->id} << 8) | b;
    {
      std::shared_lock lock(mu_);
      auto it = trans_.find(key);
      if (it != trans_.end()) return it->second;
    }
    raw = from->set;
    if (!re_.step(raw, b)) {
      remember(key, &dead_);
      return &dead_;
    }
    const DfaNode* to = find_or_add(raw);
    if (to) remember(key, to);
    return to;
  }

  const DfaNode* find_or_add(const Regex::State& set) const {
    std::string k(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int));
    {
      std::shared_lock lock(mu_);
      auto it = by_set_.find(k);
      if (it != by_set_.end()) return it->second;
    }
    std::unique_lock lock(mu_);
    auto it = by_set_.find(k);
    if (it != by_set_.end()) return it->second;
    if (nodes_.size() >= kMaxNodes || set_ints_ + set.size() > kMaxSetInts) return nullptr;
    DfaNode& n = nodes_.emplace_back();
    n.set = set;
    n.id = static_cast<uint32_t>(nodes_.size());  // 0 is the dead node
    n.dist = re_.min_bytes_to_accept(set);
    n.accepts = re_.accepts(set);
    n.cont = re_.can_continue(set);
    bool next[256];
    re_.next_bytes(set, next);
    for (int c = 0; c < 256; ++c) n.next[c] = next[c];
    set_ints_ += set.size();
    by_set_.emplace(std::move(k), &n);
    return &n;
  }

 private:
  void remember(uint64_t key, const DfaNode* to) const {
    std::unique_lock lock(mu_);
    if (trans_.size() < kMaxTrans) trans_.emplace(key, to);
  }

  const Regex& re_;
  const DfaNode* start_ = nullptr;
  DfaNode dead_;
  mutable std::shared_mutex mu_;
  mutable std::deque<DfaNode> nodes_;  // a deque: nodes never move
  mutable std::unordered_map<std::string, const DfaNode*> by_set_;
  mutable std::unordered_map<uint64_t, const DfaNode*> trans_;
  mutable size_t set_ints_ = 0;
};

class RegexState final : public StateImpl {
 public:
  void walk(const VocabIndex& ix, void* ctx, TokenSink sink) const override { walk_trie(*this, ix, ctx, sink); }
  RegexState(const Regex& re, const LazyDfa& dfa) : re_(re), dfa_(dfa), node_(dfa.start()) {
    if (!node_) raw_ = re.start();
  }
  std::unique_ptr<GrammarState> clone() const override { return std::make_unique<RegexState>(*this); }
  void assign_from(const StateImpl& o) override {
    const auto& r = static_cast<const RegexState&>(o);
    node_ = r.node_;
    if (!node_) raw_ = r.raw_;
  }
  bool step(unsigned char b) override {
    if (node_) {
      const DfaNode* n = dfa_.step(node_, b, raw_);
      if (n == dfa_.dead()) return false;
      node_ = n;
      return true;
    }
    if (!re_.step(raw_, b)) return false;
    node_ = dfa_.find_or_add(raw_);
    return true;
  }
  bool accepts() const override { return node_ ? node_->accepts : re_.accepts(raw_); }
  bool can_continue() const override { return node_ ? node_->cont : re_.can_continue(raw_); }
  int64_t min_bytes_to_accept() const override { return node_ ? node_->dist : re_.min_bytes_to_accept(raw_); }
  void next_bytes(bool out[256]) const override {
    if (!node_) return re_.next_bytes(raw_, out);
    for (int c = 0; c < 256; ++c) out[c] = node_->next[c];
  }
  bool cheap_next_bytes() const override { return true; }
  void key(std::string& out) const override {
    if (node_) {
      out.assign("D");
      out.append(reinterpret_cast<const char*>(&node_->id), sizeof node_->id);
    } else {
      out.assign("N");
      out.append(reinterpret_cast<const char*>(raw_.data()), raw_.size() * sizeof(int));
    }
  }

 private:
  const Regex& re_;
  const LazyDfa& dfa_;
  const DfaNode* node_;  // nullptr: the DFA is full, raw_ holds the NFA set
  Regex::State raw_;
};

class RegexGrammar final : public Grammar {
 public:
  RegexGrammar(Regex re, std::string what) : re_(std::move(re)), dfa_(re_), what_(std::move(what)) {}
  std::unique_ptr<GrammarState> start() const override { return std::make_unique<RegexState>(re_, dfa_); }
  std::string describe() const override { return what_; }

 private:
  Regex re_;
  LazyDfa dfa_;
  std::string what_;
};

// The choices as a byte trie; a state is a trie node.
class ChoicesGrammar final : public Grammar {
 public:
  explicit ChoicesGrammar(const std::vector<std::string>& choices) {
    nodes_.emplace_back();
    for (const auto& c : choices) {
      int n = 0;
      for (unsigned char b : c) {
        auto& kids = nodes_[n].kids;
        auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& e) { return e.first == b; });
        if (it != kids.end()) {
          n = it->second;
        } else {
          kids.emplace_back(b, static_cast<int>(nodes_.size()));
          n = static_cast<int>(nodes_.size());
          nodes_.emplace_back();
        }
      }
      nodes_[n].terminal = true;
    }
    // Children always have larger indices: one backward pass gives every node's distance.
    for (size_t i = nodes_.size(); i-- > 0;) {
      Node& nd = nodes_[i];
      nd.dist = nd.terminal ? 0 : INT64_MAX;
      for (const auto& [b, k] : nd.kids) nd.dist = std::min(nd.dist, nodes_[k].dist + 1);
    }
    describe_ = "choices [";
    for (size_t i = 0; i < choices.size() && describe_.size() < 200; ++i)
      describe_ += (i ? ", " : "") + nlohmann::json(choices[i]).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    describe_ += describe_.size() >= 200 ? ", ...]" : "]";
  }
  std::unique_ptr<GrammarState> start() const override;
  std::string describe() const override { return describe_; }

  struct Node {
    std::vector<std::pair<unsigned char, int>> kids;
    bool terminal = false;
    int64_t dist = 0;
  };
  std::vector<Node> nodes_;
  std::string describe_;
};

class ChoiceState final : public StateImpl {
 public:
  void walk(const VocabIndex& ix, void* ctx, TokenSink sink) const override { walk_trie(*this, ix, ctx, sink); }
  ChoiceState(const ChoicesGrammar& g, int node) : g_(g), n_(node) {}
  std::unique_ptr<GrammarState> clone() const override { return std::make_unique<ChoiceState>(g_, n_); }
  void assign_from(const StateImpl& o) override { n_ = static_cast<const ChoiceState&>(o).n_; }
  bool step(unsigned char b) override {
    for (const auto& [c, k] : g_.nodes_[n_].kids)
      if (c == b) {
        n_ = k;
        return true;
      }
    return false;
  }
  bool accepts() const override { return g_.nodes_[n_].terminal; }
  bool can_continue() const override { return !g_.nodes_[n_].kids.empty(); }
  int64_t min_bytes_to_accept() const override { return g_.nodes_[n_].dist; }
  void next_bytes(bool out[256]) const override {
    std::fill(out, out + 256, false);
    for (const auto& [c, k] : g_.nodes_[n_].kids) out[c] = true;
  }
  bool cheap_next_bytes() const override { return true; }
  void key(std::string& out) const override { out.assign(reinterpret_cast<const char*>(&n_), sizeof n_); }

 private:
  const ChoicesGrammar& g_;
  int n_;
};

std::unique_ptr<GrammarState> ChoicesGrammar::start() const { return std::make_unique<ChoiceState>(*this, 0); }

}  // namespace
}  // namespace constraint

std::shared_ptr<const Grammar> Grammar::regex(const std::string& pattern) {
  const std::string shown = pattern.size() > 200 ? pattern.substr(0, 200) + "..." : pattern;
  // A user's pattern gets a smaller automaton than a schema's: each mask() step can cost up to
  // (live trie edges) x (NFA states in the current set) before the DFA has seen the states.
  constexpr size_t kMaxUserRegexNodes = 20000;
  return std::make_shared<constraint::RegexGrammar>(Regex::compile(pattern, "regex", kMaxUserRegexNodes), "regex " + shown);
}

std::shared_ptr<const Grammar> Grammar::choices(const std::vector<std::string>& choices) {
  CORELM_CHECK(!choices.empty(), ValueError, "choices: the list is empty");
  size_t total = 0;
  for (const auto& c : choices) total += c.size();
  CORELM_CHECK(total <= (1u << 20), ValueError, "choices: ", total, " bytes in all, above the limit of 1 MiB");
  return std::make_shared<constraint::ChoicesGrammar>(choices);
}

std::shared_ptr<const Grammar> Grammar::json_schema(const nlohmann::json& schema) {
  const std::string pattern = constraint::schema_to_regex(schema);
  return std::make_shared<constraint::RegexGrammar>(Regex::compile(pattern, "json_schema"), "json_schema");
}

std::shared_ptr<const Grammar> Grammar::json_schema(const nlohmann::ordered_json& schema) {
  const std::string pattern = constraint::schema_to_regex(schema);
  return std::make_shared<constraint::RegexGrammar>(Regex::compile(pattern, "json_schema"), "json_schema");
}

}  // namespace corelm::infer
