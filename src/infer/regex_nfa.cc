// Regex -> syntax tree (recursive descent) -> Thompson NFA built back to front, then simulated on
// state sets. States that cannot reach the match are pruned, so a non-empty set means "viable".
// Each node also knows its distance in bytes to the match (for forcing completion).
#include "infer/regex_nfa.h"

#include <algorithm>
#include <deque>
#include <memory>

#include "corelm/error.h"

namespace corelm::infer {

namespace {
struct Ast {
  enum Kind { Set, Concat, Alt, Repeat } kind = Concat;
  std::bitset<256> bytes;
  std::vector<std::unique_ptr<Ast>> kids;
  int min = 0, max = -1;  // Repeat; max -1 = unbounded
};
}  // namespace

class RegexCompiler {
 public:
  RegexCompiler(const std::string& p, const std::string& what, Regex& re) : p_(p), what_(what), re_(re) {}

  void run() {
    auto ast = alternation();
    if (i_ != p_.size()) fail("unexpected ')'");
    re_.nodes_.push_back({});
    re_.nodes_.back().match = true;
    re_.start_ = emit(*ast, 0);
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    std::string shown = p_.size() > 200 ? p_.substr(0, 200) + "..." : p_;
    throw ValueError(what_ + ": " + why + " at position " + std::to_string(i_) + " of '" + shown + "'");
  }
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }

  // Parsing and emission recurse once per group level: bound it so a hostile pattern cannot
  // exhaust the stack.
  std::unique_ptr<Ast> alternation() {
    if (++depth_ > 400) fail("groups nested deeper than 400");
    auto alt = std::make_unique<Ast>();
    alt->kind = Ast::Alt;
    alt->kids.push_back(concat());
    while (at('|')) {
      ++i_;
      alt->kids.push_back(concat());
    }
    --depth_;
    return alt;
  }
  std::unique_ptr<Ast> concat() {
    auto cat = std::make_unique<Ast>();
    cat->kind = Ast::Concat;
    while (i_ < p_.size() && !at('|') && !at(')')) cat->kids.push_back(repeat());
    return cat;
  }
  int number() {
    if (i_ >= p_.size() || !isdigit(static_cast<unsigned char>(p_[i_]))) fail("expected a number");
    int v = 0;
    while (i_ < p_.size() && isdigit(static_cast<unsigned char>(p_[i_]))) {
      v = v * 10 + (p_[i_++] - '0');
      if (v > 1000) fail("repeat count above 1000");
    }
    return v;
  }
  std::unique_ptr<Ast> repeat() {
    auto atom_ast = atom();
    for (;;) {
      int lo, hi;
      if (at('*')) lo = 0, hi = -1, ++i_;
      else if (at('+')) lo = 1, hi = -1, ++i_;
      else if (at('?')) lo = 0, hi = 1, ++i_;
      else if (at('{')) {
        ++i_;
        lo = number();
        hi = lo;
        if (at(',')) {
          ++i_;
          hi = at('}') ? -1 : number();
        }
        if (!at('}')) fail("expected '}'");
        ++i_;
        if (hi >= 0 && hi < lo) fail("{m,n} with n < m");
      } else {
        return atom_ast;
      }
      auto r = std::make_unique<Ast>();
      r->kind = Ast::Repeat;
      r->min = lo;
      r->max = hi;
      r->kids.push_back(std::move(atom_ast));
      atom_ast = std::move(r);
    }
  }
  std::bitset<256> escape_class(char c, bool& ok) {
    std::bitset<256> s;
    ok = true;
    auto range = [&](int a, int b) {
      for (int x = a; x <= b; ++x) s.set(x);
    };
    switch (c) {
      case 'd': case 'D': range('0', '9'); break;
      case 'w': case 'W': range('0', '9'); range('a', 'z'); range('A', 'Z'); s.set('_'); break;
      case 's': case 'S': for (char x : std::string(" \t\n\r\f\v")) s.set(static_cast<unsigned char>(x)); break;
      case 'n': s.set('\n'); return s;
      case 't': s.set('\t'); return s;
      case 'r': s.set('\r'); return s;
      default:
        if (isalnum(static_cast<unsigned char>(c))) fail(std::string("unsupported escape \\") + c);
        s.set(static_cast<unsigned char>(c));
        return s;
    }
    if (isupper(static_cast<unsigned char>(c))) s.flip();
    return s;
  }
  std::unique_ptr<Ast> atom() {
    auto a = std::make_unique<Ast>();
    a->kind = Ast::Set;
    if (i_ >= p_.size()) fail("unexpected end");
    char c = p_[i_++];
    bool ok = true;
    switch (c) {
      case '(': {
        if (at('?')) fail("group modifiers (?...) are not supported");
        auto inner = alternation();
        if (!at(')')) fail("missing ')'");
        ++i_;
        return inner;
      }
      case '.': a->bytes.set(); a->bytes.reset('\n'); return a;
      case '\\':
        if (i_ >= p_.size()) fail("trailing backslash");
        a->bytes = escape_class(p_[i_++], ok);
        return a;
      case '[': return char_class();
      case '*': case '+': case '?': case '{': fail("quantifier without an operand");
      case '^': case '$': fail("anchors are implicit (the whole output must match)");
      default: a->bytes.set(static_cast<unsigned char>(c)); return a;
    }
  }
  std::unique_ptr<Ast> char_class() {
    auto a = std::make_unique<Ast>();
    a->kind = Ast::Set;
    bool negate = at('^');
    if (negate) ++i_;
    bool first = true;
    while (i_ < p_.size() && (first || !at(']'))) {
      first = false;
      unsigned char lo = static_cast<unsigned char>(p_[i_++]);
      if (lo == '\\') {
        if (i_ >= p_.size()) fail("trailing backslash");
        bool ok;
        a->bytes |= escape_class(p_[i_++], ok);
        continue;
      }
      if (at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        unsigned char hi = static_cast<unsigned char>(p_[i_ + 1]);
        i_ += 2;
        if (hi < lo) fail("reversed class range");
        for (int x = lo; x <= hi; ++x) a->bytes.set(x);
      } else {
        a->bytes.set(lo);
      }
    }
    if (!at(']')) fail("missing ']'");
    ++i_;
    if (negate) a->bytes.flip();
    return a;
  }

  int add(Regex::Node n) {
    if (re_.nodes_.size() >= re_.max_nodes_)
      fail("pattern too large (its automaton would exceed " + std::to_string(re_.max_nodes_) + " states)");
    re_.nodes_.push_back(n);
    return static_cast<int>(re_.nodes_.size()) - 1;
  }
  // Emits the NFA of `a` followed by state `next`; returns its entry state.
  int emit(const Ast& a, int next) {
    switch (a.kind) {
      case Ast::Set: {
        Regex::Node n;
        n.bytes = a.bytes;
        n.out1 = next;
        return add(n);
      }
      case Ast::Concat:
        for (auto it = a.kids.rbegin(); it != a.kids.rend(); ++it) next = emit(**it, next);
        return next;
      case Ast::Alt: {
        int entry = emit(*a.kids.back(), next);
        for (int k = static_cast<int>(a.kids.size()) - 2; k >= 0; --k) {
          Regex::Node s;
          s.split = true;
          s.out1 = emit(*a.kids[k], next);
          s.out2 = entry;
          entry = add(s);
        }
        return entry;
      }
      case Ast::Repeat: {
        int cur = next;
        if (a.max < 0) {
          Regex::Node s;
          s.split = true;
          s.out2 = next;
          int loop = add(s);
          re_.nodes_[loop].out1 = emit(*a.kids[0], loop);
          cur = loop;
        } else {
          for (int k = 0; k < a.max - a.min; ++k) {
            Regex::Node s;
            s.split = true;
            s.out1 = emit(*a.kids[0], cur);
            s.out2 = next;
            cur = add(s);
          }
        }
        for (int k = 0; k < a.min; ++k) cur = emit(*a.kids[0], cur);
        return cur;
      }
    }
    return next;
  }

  const std::string& p_;
  const std::string& what_;
  Regex& re_;
  size_t i_ = 0;
  int depth_ = 0;
};

Regex Regex::compile(const std::string& pattern, const std::string& what, size_t max_nodes) {
  Regex re;
  re.max_nodes_ = std::min(max_nodes, kMaxNodes);
  RegexCompiler(pattern, what, re).run();
  // Distance to the match over the reverse edges (0-1 BFS: splits cost no byte, consuming nodes
  // one); a node is live when it has a distance.
  const size_t n = re.nodes_.size();
  std::vector<std::vector<int>> rev(n);
  for (size_t i = 0; i < n; ++i) {
    const Node& s = re.nodes_[i];
    if (s.split) {
      if (s.out1 >= 0) rev[s.out1].push_back(static_cast<int>(i));
      if (s.out2 >= 0) rev[s.out2].push_back(static_cast<int>(i));
    } else if (!s.match && s.bytes.any() && s.out1 >= 0) {
      rev[s.out1].push_back(static_cast<int>(i));
    }
  }
  constexpr int64_t kInf = INT64_MAX;
  re.dist_.assign(n, kInf);
  std::deque<int> q;
  re.dist_[0] = 0;
  q.push_back(0);
  while (!q.empty()) {
    int v = q.front();
    q.pop_front();
    for (int u : rev[v]) {
      const int64_t w = re.nodes_[u].split ? 0 : 1;
      if (re.dist_[v] + w < re.dist_[u]) {
        re.dist_[u] = re.dist_[v] + w;
        if (w == 0) q.push_front(u);
        else q.push_back(u);
      }
    }
  }
  re.live_.assign(n, false);
  for (size_t i = 0; i < n; ++i) re.live_[i] = re.dist_[i] != kInf;
  return re;
}

void Regex::closure(State& s) const {
  // Generation-stamped scratch per thread: no O(nodes) clearing per byte.
  thread_local std::vector<uint32_t> seen;
  thread_local uint32_t gen = 0;
  thread_local std::vector<int> stack;
  if (seen.size() < nodes_.size()) seen.assign(nodes_.size(), 0), gen = 0;
  if (++gen == 0) std::fill(seen.begin(), seen.end(), 0), gen = 1;
  stack.assign(s.begin(), s.end());
  s.clear();
  while (!stack.empty()) {
    int i = stack.back();
    stack.pop_back();
    if (i < 0 || seen[i] == gen || !live_[i]) continue;
    seen[i] = gen;
    const Node& n = nodes_[i];
    if (n.split) {
      stack.push_back(n.out1);
      stack.push_back(n.out2);
    } else {
      s.push_back(i);
    }
  }
  std::sort(s.begin(), s.end());
}

Regex::State Regex::start() const {
  State s{start_};
  closure(s);
  return s;
}

bool Regex::step(State& state, unsigned char c) const {
  thread_local State next;
  next.clear();
  for (int i : state) {
    const Node& n = nodes_[i];
    if (!n.match && n.bytes.test(c)) next.push_back(n.out1);
  }
  closure(next);
  state.swap(next);
  return !state.empty();
}

bool Regex::advance(State& state, std::string_view bytes) const {
  for (unsigned char c : bytes)
    if (!step(state, c)) return false;
  return !state.empty();
}

bool Regex::accepts(const State& state) const { return std::binary_search(state.begin(), state.end(), 0); }

bool Regex::can_continue(const State& state) const {
  for (int i : state)
    if (!nodes_[i].match) return true;  // a live consuming node has a viable byte
  return false;
}

int64_t Regex::min_bytes_to_accept(const State& state) const {
  int64_t best = INT64_MAX;
  for (int i : state) best = std::min(best, dist_[i]);
  return best;
}

void Regex::next_bytes(const State& state, bool out[256]) const {
  std::bitset<256> any;
  for (int i : state)
    if (!nodes_[i].match) any |= nodes_[i].bytes;
  for (int b = 0; b < 256; ++b) out[b] = any.test(b);
}

}  // namespace corelm::infer
