// Regex -> syntax tree (recursive descent) -> Thompson NFA built back to front, then simulated on
// state sets. States that cannot reach the match are pruned, so a non-empty set means "viable".
#include "pipeline/regex_nfa.h"

#include <algorithm>
#include <memory>

#include "corelm/error.h"

namespace corelm::pipeline {

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
  RegexCompiler(const std::string& p, Regex& re) : p_(p), re_(re) {}

  void run() {
    auto ast = alternation();
    if (i_ != p_.size()) fail("unexpected ')'");
    re_.nodes_.push_back({});
    re_.nodes_.back().match = true;
    re_.start_ = emit(*ast, 0);
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw ValueError("--regex: " + why + " at position " + std::to_string(i_) + " of '" + p_ + "'");
  }
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }

  std::unique_ptr<Ast> alternation() {
    auto alt = std::make_unique<Ast>();
    alt->kind = Ast::Alt;
    alt->kids.push_back(concat());
    while (at('|')) {
      ++i_;
      alt->kids.push_back(concat());
    }
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
  Regex& re_;
  size_t i_ = 0;
};

Regex Regex::compile(const std::string& pattern) {
  Regex re;
  RegexCompiler(pattern, re).run();
  // Liveness: a state is live when it can reach the match (fixpoint over the reverse edges).
  const size_t n = re.nodes_.size();
  re.live_.assign(n, false);
  re.live_[0] = true;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (re.live_[i]) continue;
      const Node& s = re.nodes_[i];
      bool l = (s.out1 >= 0 && re.live_[s.out1] && (s.split || s.bytes.any())) || (s.out2 >= 0 && re.live_[s.out2]);
      if (l) re.live_[i] = changed = true;
    }
  }
  return re;
}

void Regex::closure(State& s) const {
  std::vector<int> stack(s.begin(), s.end()), out;
  std::vector<char> seen(nodes_.size(), 0);
  while (!stack.empty()) {
    int i = stack.back();
    stack.pop_back();
    if (i < 0 || seen[i] || !live_[i]) continue;
    seen[i] = 1;
    const Node& n = nodes_[i];
    if (n.split) {
      stack.push_back(n.out1);
      stack.push_back(n.out2);
    } else {
      out.push_back(i);
    }
  }
  std::sort(out.begin(), out.end());
  s = std::move(out);
}

Regex::State Regex::start() const {
  State s{start_};
  closure(s);
  return s;
}

bool Regex::advance(State& state, std::string_view bytes) const {
  for (unsigned char c : bytes) {
    State next;
    for (int i : state) {
      const Node& n = nodes_[i];
      if (!n.match && n.bytes.test(c)) next.push_back(n.out1);
    }
    closure(next);
    state = std::move(next);
    if (state.empty()) return false;
  }
  return !state.empty();
}

bool Regex::accepts(const State& state) const { return std::binary_search(state.begin(), state.end(), 0); }

}  // namespace corelm::pipeline
