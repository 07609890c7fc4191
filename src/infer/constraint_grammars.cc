// The regex and choices grammars (and json_schema, which compiles to a regex).
#include <algorithm>
#include <cstring>

#include "corelm/error.h"
#include "infer/constraint_impl.h"
#include "infer/regex_nfa.h"

namespace corelm::infer {
namespace constraint {
namespace {

class RegexGrammar;

class RegexState final : public StateImpl {
 public:
  RegexState(const Regex& re, Regex::State s) : re_(re), s_(std::move(s)) {}
  std::unique_ptr<GrammarState> clone() const override { return std::make_unique<RegexState>(re_, s_); }
  void assign_from(const StateImpl& o) override { s_ = static_cast<const RegexState&>(o).s_; }
  bool step(unsigned char b) override { return re_.step(s_, b); }
  bool accepts() const override { return re_.accepts(s_); }
  bool can_continue() const override { return re_.can_continue(s_); }
  int64_t min_bytes_to_accept() const override { return re_.min_bytes_to_accept(s_); }
  void next_bytes(bool out[256]) const override { re_.next_bytes(s_, out); }
  bool cheap_next_bytes() const override { return true; }
  void key(std::string& out) const override {
    out.assign(reinterpret_cast<const char*>(s_.data()), s_.size() * sizeof(int));
  }

 private:
  const Regex& re_;
  Regex::State s_;
};

class RegexGrammar final : public Grammar {
 public:
  RegexGrammar(Regex re, std::string what) : re_(std::move(re)), what_(std::move(what)) {}
  std::unique_ptr<GrammarState> start() const override { return std::make_unique<RegexState>(re_, re_.start()); }
  std::string describe() const override { return what_; }

 private:
  Regex re_;
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
  return std::make_shared<constraint::RegexGrammar>(Regex::compile(pattern, "regex"), "regex " + shown);
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
