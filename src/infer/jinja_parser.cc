// Lexer and parser of the chat-template subset. The lexer follows jinja2's (lexer.py) rules as
// transformers configures them: trim_blocks (a block or comment tag swallows one newline after
// it), lstrip_blocks (spaces and tabs from the start of a line up to a block or comment tag are
// dropped, unless the tag is opened with `+`), `-` strips all whitespace on that side, \r\n and \r
// become \n, and one trailing newline of the source is dropped. The grammar and the operator
// precedence are those of jinja2's parser.py.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>

#include "corelm/chat_template.h"
#include "infer/jinja_ast.h"

namespace corelm::infer::jinja {

std::string where(Pos p) {
  return "chat template line " + std::to_string(p.line) + ":" + std::to_string(p.col) + ": ";
}

namespace {

[[noreturn]] void fail(Pos p, const std::string& msg) { throw TemplateError(where(p) + msg); }

struct Token {
  enum class T { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  T t;
  Pos pos;
  std::string s;  // Text / Name / Op / String (unescaped) / number spelling
};

std::string normalize_newlines(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      out += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      out += in[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // jinja2's keep_trailing_newline=False
  return out;
}

void put_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(normalize_newlines(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (i_ < s_.size()) {
      // The next tag opener.
      size_t open = i_;
      char kind = 0;
      while ((open = s_.find('{', open)) != std::string::npos) {
        if (open + 1 < s_.size() && (s_[open + 1] == '{' || s_[open + 1] == '%' || s_[open + 1] == '#')) {
          kind = s_[open + 1];
          break;
        }
        ++open;
      }
      if (open == std::string::npos) {
        emit_text(s_.substr(i_), pos_at(i_));
        i_ = s_.size();
        break;
      }
      std::string text = s_.substr(i_, open - i_);
      const Pos text_pos = pos_at(i_);
      size_t after = open + 2;
      char sign = 0;
      if (after < s_.size() && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
      if (sign == '-') {
        text.resize(text.size() - trailing_space(text));
      } else if (sign != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(text, l_pos)) text.resize(l_pos);
      }
      emit_text(std::move(text), text_pos);
      const Pos tag_pos = pos_at(open);
      if (kind == '#') {
        size_t close = s_.find("#}", after);
        if (close == std::string::npos) fail(tag_pos, "missing end of comment tag '#}'");
        const char before = close > after ? s_[close - 1] : 0;
        i_ = close + 2;
        if (before == '-') skip_space();
        else if (before != '+' && i_ < s_.size() && s_[i_] == '\n') ++i_;
        line_starting = i_ > 0 && s_[i_ - 1] == '\n';
        continue;
      }
      const bool block = kind == '%';
      if (block) check_raw(after, tag_pos);
      out_.push_back({block ? Token::T::BlockBegin : Token::T::VarBegin, tag_pos, ""});
      i_ = after;
      line_starting = lex_tag(block, tag_pos);
    }
    out_.push_back({Token::T::End, pos_at(s_.size()), ""});
    return std::move(out_);
  }

 private:
  Pos pos_at(size_t at) {
    // Positions are asked for in increasing order: advance the line / column cursor.
    for (; cur_ < at && cur_ < s_.size(); ++cur_) {
      if (s_[cur_] == '\n') {
        ++cur_pos_.line;
        cur_pos_.col = 1;
      } else if ((static_cast<unsigned char>(s_[cur_]) & 0xC0) != 0x80) {
        ++cur_pos_.col;
      }
    }
    return cur_pos_;
  }

  static size_t trailing_space(const std::string& t) {
    size_t n = t.size();
    while (n > 0) {
      const size_t w = space_before(t, n);
      if (w == 0) break;
      n -= w;
    }
    return t.size() - n;
  }
  static bool all_space(const std::string& t, size_t from) {
    while (from < t.size()) {
      const size_t w = space_at(t, from);
      if (w == 0) return false;
      from += w;
    }
    return true;
  }
  void skip_space() {
    while (i_ < s_.size()) {
      const size_t w = space_at(s_, i_);
      if (w == 0) break;
      i_ += w;
    }
  }
  void emit_text(std::string text, Pos p) {
    if (!text.empty()) out_.push_back({Token::T::Text, p, std::move(text)});
  }

  void check_raw(size_t after, Pos p) {
    size_t k = after;
    while (k < s_.size() && space_at(s_, k)) k += space_at(s_, k);
    if (s_.compare(k, 3, "raw") == 0 && (k + 3 >= s_.size() || !(std::isalnum(static_cast<unsigned char>(s_[k + 3])) || s_[k + 3] == '_')))
      fail(p, "unsupported construct '{% raw %}' (not in corelm's chat-template subset)");
  }

  // Lexes the inside of a {{ }} / {% %} tag up to and including its end; returns whether the
  // end swallowed a newline (jinja2's line_starting, which lets lstrip_blocks strip the next line).
  bool lex_tag(bool block, Pos tag_pos) {
    std::vector<char> balance;
    for (;;) {
      if (i_ >= s_.size()) fail(tag_pos, block ? "unexpected end of template: missing '%}'" : "unexpected end of template: missing '}}'");
      if (balance.empty()) {
        const char* end = block ? "%}" : "}}";
        const Pos p = pos_at(i_);
        if ((s_[i_] == '-' || (block && s_[i_] == '+')) && s_.compare(i_ + 1, 2, end) == 0) {
          const char sign = s_[i_];
          i_ += 3;
          if (sign == '-') skip_space();
          out_.push_back({block ? Token::T::BlockEnd : Token::T::VarEnd, p, ""});
          return i_ > 0 && s_[i_ - 1] == '\n';
        }
        if (s_.compare(i_, 2, end) == 0) {
          i_ += 2;
          if (block && i_ < s_.size() && s_[i_] == '\n') ++i_;  // trim_blocks
          out_.push_back({block ? Token::T::BlockEnd : Token::T::VarEnd, p, ""});
          return block && s_[i_ - 1] == '\n';
        }
      }
      if (const size_t w = space_at(s_, i_)) {
        i_ += w;
        continue;
      }
      const Pos p = pos_at(i_);
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (std::isdigit(c)) {
        lex_number(p);
      } else if (std::isalpha(c) || c == '_' || c >= 0x80) {
        size_t j = i_;
        while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_' ||
                                 static_cast<unsigned char>(s_[j]) >= 0x80))
          ++j;
        out_.push_back({Token::T::Name, p, s_.substr(i_, j - i_)});
        i_ = j;
      } else if (c == '\'' || c == '"') {
        lex_string(p);
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (s_.compare(i_, 2, t) == 0) op = t;
        if (op.empty()) {
          if (std::strchr("+-/*%~[](){}><=.:|,;", static_cast<char>(c)) == nullptr || c == 0)
            fail(p, std::string("unexpected character '") + static_cast<char>(c) + "'");
          op = std::string(1, static_cast<char>(c));
        }
        if (op == "(" || op == "[" || op == "{") {
          if (balance.size() >= static_cast<size_t>(Limits::kMaxNesting)) fail(p, "brackets nested too deeply");
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) fail(p, "unexpected '" + op + "'");
          if (balance.back() != op[0]) fail(p, "unexpected '" + op + "', expected '" + std::string(1, balance.back()) + "'");
          balance.pop_back();
        }
        out_.push_back({Token::T::Op, p, op});
        i_ += op.size();
      }
    }
  }

  void lex_number(Pos p) {
    auto digits = [&](size_t j) {  // (\d+_)*\d+ from j; returns the end (j when none)
      size_t k = j;
      while (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
        ++k;
        if (k + 1 < s_.size() && s_[k] == '_' && std::isdigit(static_cast<unsigned char>(s_[k + 1]))) ++k;
      }
      return k;
    };
    size_t j = digits(i_);
    bool is_float = false;
    if (j + 1 < s_.size() && s_[j] == '.' && std::isdigit(static_cast<unsigned char>(s_[j + 1]))) {
      j = digits(j + 1);
      is_float = true;
    }
    if (j < s_.size() && (s_[j] == 'e' || s_[j] == 'E')) {
      size_t k = j + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      const size_t e = digits(k);
      if (e > k) {
        j = e;
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = i_; k < j; ++k)
      if (s_[k] != '_') text += s_[k];
    out_.push_back({is_float ? Token::T::Float : Token::T::Int, p, text});
    i_ = j;
  }

  // A string literal, unescaped as Python's "unicode-escape" codec does (jinja2's lexer).
  void lex_string(Pos p) {
    const char q = s_[i_];
    std::string out;
    size_t j = i_ + 1;
    for (;;) {
      if (j >= s_.size()) fail(p, "unterminated string literal");
      const char c = s_[j];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++j;
        continue;
      }
      if (j + 1 >= s_.size()) fail(p, "unterminated string literal");
      const char e = s_[j + 1];
      j += 2;
      auto hex = [&](int n) -> uint32_t {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k, ++j) {
          if (j >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[j])))
            fail(p, "truncated \\x / \\u escape in a string literal");
          const char h = s_[j];
          v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': put_utf8(out, hex(2)); break;
        case 'u': put_utf8(out, hex(4)); break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) fail(p, "\\U escape out of the Unicode range");
          put_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && j < s_.size() && s_[j] >= '0' && s_[j] <= '7'; ++k, ++j) v = v * 8 + static_cast<uint32_t>(s_[j] - '0');
            put_utf8(out, v);
          } else if (e == 'N') {
            fail(p, "unsupported \\N{...} escape in a string literal");
          } else {
            out += '\\';  // Python keeps an unknown escape as written
            out += e;
          }
      }
    }
    out_.push_back({Token::T::String, p, std::move(out)});
    i_ = j + 1;
  }

  std::string s_;
  size_t i_ = 0;
  size_t cur_ = 0;
  Pos cur_pos_;
  std::vector<Token> out_;
};

// Recursive descent over the tokens, jinja2's grammar.
class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Program program() {
    Program p;
    std::string end;
    p.body = body({}, end);
    return p;
  }

 private:
  const Token& cur() const { return t_[k_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(k_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().t == Token::T::Op && cur().s == op; }
  bool is_name(const char* n) const { return cur().t == Token::T::Name && cur().s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur().pos, std::string("expected '") + op + "', got " + describe(cur()));
    ++k_;
  }
  static std::string describe(const Token& t) {
    switch (t.t) {
      case Token::T::End: return "end of template";
      case Token::T::VarEnd: return "end of print statement '}}'";
      case Token::T::BlockEnd: return "end of statement block '%}'";
      case Token::T::String: return "a string";
      case Token::T::Text: return "template text";
      default: return "'" + t.s + "'";
    }
  }
  void expect_block_end(const std::string& tag) {
    if (cur().t != Token::T::BlockEnd) fail(cur().pos, "expected '%}' to close '{% " + tag + " %}', got " + describe(cur()));
    ++k_;
  }

  struct Depth {
    Depth(int& d, Pos p) : d_(d) {
      if (++d_ > Limits::kMaxNesting) fail(p, "template nested too deeply (more than " + std::to_string(Limits::kMaxNesting) + " levels)");
    }
    ~Depth() { --d_; }
    int& d_;
  };

  // Statements up to one of the `ends` tags ({% endfor %} ...), whose name is returned in `end`
  // with the stream left after that tag's name.
  Body body(const std::set<std::string>& ends, std::string& end) {
    Body out;
    for (;;) {
      const Token& tk = cur();
      if (tk.t == Token::T::End) {
        std::string closer = ends.empty() ? "" : *ends.begin();
        for (const auto& e : ends)
          if (e.starts_with("end")) closer = e;
        if (!ends.empty()) fail(tk.pos, "unexpected end of template: missing '{% " + closer + " %}'" +
                                             (open_.empty() ? "" : " for the '{% " + open_.back().first + " %}' at line " +
                                                                      std::to_string(open_.back().second.line) + ":" +
                                                                      std::to_string(open_.back().second.col)));
        end.clear();
        return out;
      }
      if (tk.t == Token::T::Text) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::Text;
        n->pos = tk.pos;
        n->text = tk.s;
        out.push_back(std::move(n));
        ++k_;
        continue;
      }
      if (tk.t == Token::T::VarBegin) {
        ++k_;
        auto n = std::make_unique<Node>();
        n->k = Node::K::Output;
        n->pos = tk.pos;
        n->expr = expression();
        if (cur().t != Token::T::VarEnd) fail(cur().pos, "expected '}}', got " + describe(cur()));
        ++k_;
        out.push_back(std::move(n));
        continue;
      }
      if (tk.t != Token::T::BlockBegin) fail(tk.pos, "unexpected " + describe(tk));
      ++k_;
      if (cur().t != Token::T::Name) fail(cur().pos, "expected a statement name after '{%', got " + describe(cur()));
      const std::string tag = cur().s;
      if (ends.count(tag)) {
        ++k_;
        end = tag;
        return out;
      }
      out.push_back(statement(tk.pos));
    }
  }

  // `open` is where the statement's '{%' is: what errors about the whole statement name.
  std::unique_ptr<Node> statement(Pos open) {
    Token tk = cur();
    tk.pos = open;
    const std::string& tag = tk.s;
    Depth d(depth_, tk.pos);
    ++k_;
    auto n = std::make_unique<Node>();
    n->pos = tk.pos;
    if (tag == "if") {
      n->k = Node::K::If;
      n->conditions.push_back(expression());
      expect_block_end("if");
      open_.emplace_back("if", tk.pos);
      for (;;) {
        std::string end;
        n->bodies.push_back(body({"endif", "elif", "else"}, end));
        if (end == "elif") {
          n->conditions.push_back(expression());
          expect_block_end("elif");
        } else if (end == "else") {
          expect_block_end("else");
          n->bodies.push_back(body({"endif"}, end));
          expect_block_end("endif");
          break;
        } else {
          expect_block_end("endif");
          break;
        }
      }
      open_.pop_back();
      return n;
    }
    if (tag == "for") {
      n->k = Node::K::For;
      for (;;) {
        if (cur().t != Token::T::Name) fail(cur().pos, "expected a loop variable name, got " + describe(cur()));
        n->targets.push_back(cur().s);
        ++k_;
        if (!is_op(",")) break;
        ++k_;
      }
      if (!is_name("in")) fail(cur().pos, "expected 'in' in '{% for %}', got " + describe(cur()));
      ++k_;
      n->expr = cond_expr(false);  // jinja2: parse_tuple(with_condexpr=False), so `if` starts the filter
      if (is_op(",")) fail(cur().pos, "unsupported construct: a tuple as the iterable of '{% for %}'");
      if (is_name("if")) {
        ++k_;
        n->filter = expression();
      }
      if (is_name("recursive")) fail(cur().pos, "unsupported construct '{% for ... recursive %}' (recursive loops)");
      expect_block_end("for");
      open_.emplace_back("for", tk.pos);
      std::string end;
      n->bodies.push_back(body({"endfor", "else"}, end));
      if (end == "else") {
        expect_block_end("else");
        n->bodies.push_back(body({"endfor"}, end));
      }
      expect_block_end("endfor");
      open_.pop_back();
      return n;
    }
    if (tag == "set") {
      if (cur().t != Token::T::Name) fail(cur().pos, "expected a variable name after '{% set', got " + describe(cur()));
      n->targets.push_back(cur().s);
      ++k_;
      if (is_op(".")) {
        ++k_;
        if (cur().t != Token::T::Name) fail(cur().pos, "expected an attribute name after '.', got " + describe(cur()));
        n->attr = cur().s;
        ++k_;
      } else {
        while (is_op(",")) {
          ++k_;
          if (cur().t != Token::T::Name) fail(cur().pos, "expected a variable name, got " + describe(cur()));
          n->targets.push_back(cur().s);
          ++k_;
        }
      }
      if (cur().t == Token::T::BlockEnd && n->attr.empty() && n->targets.size() == 1) {
        ++k_;  // {% set x %}...{% endset %}
        n->k = Node::K::SetBlock;
        open_.emplace_back("set", tk.pos);
        std::string end;
        n->bodies.push_back(body({"endset"}, end));
        expect_block_end("endset");
        open_.pop_back();
        return n;
      }
      if (is_op("|")) fail(cur().pos, "unsupported construct: a filtered '{% set %}' block");
      n->k = Node::K::Set;
      expect_op("=");
      n->expr = tuple_or_expr();
      expect_block_end("set");
      return n;
    }
    if (tag == "break" || tag == "continue") {
      // transformers enables jinja2.ext.loopcontrols: legal inside a loop only.
      bool in_loop = false;
      for (const auto& o : open_) in_loop = in_loop || o.first == "for";
      if (!in_loop) fail(tk.pos, "'" + tag + "' outside of a loop");
      n->k = tag == "break" ? Node::K::Break : Node::K::Continue;
      expect_block_end(tag);
      return n;
    }
    if (tag == "generation") {
      // transformers' AssistantTracker tag: marks assistant text for masks; renders its body.
      n->k = Node::K::Scope;
      expect_block_end(tag);
      open_.emplace_back("generation", tk.pos);
      std::string end;
      n->bodies.push_back(body({"endgeneration"}, end));
      expect_block_end("endgeneration");
      open_.pop_back();
      return n;
    }
    static const std::set<std::string> known = {"macro", "call", "filter", "include", "import", "from", "extends",
                                                "block", "with", "autoescape", "do", "trans", "pluralize"};
    if (known.count(tag)) fail(tk.pos, "unsupported construct '{% " + tag + " %}' (not in corelm's chat-template subset)");
    static const std::set<std::string> closers = {"endif", "endfor", "elif", "else", "endset", "endgeneration",
                                                  "endmacro", "endcall", "endfilter", "endblock", "endwith"};
    if (closers.count(tag))
      fail(tk.pos, "unexpected '{% " + tag + " %}'" +
                       (open_.empty() ? std::string(" (no open block)")
                                      : " (the innermost open block is '{% " + open_.back().first + " %}' at line " +
                                            std::to_string(open_.back().second.line) + ":" +
                                            std::to_string(open_.back().second.col) + ")"));
    fail(tk.pos, "unknown statement '{% " + tag + " %}'");
  }

  ExprP node(Expr::K k, Pos p) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = p;
    return e;
  }

  static bool known_test(const std::string& n) {
    static const std::set<std::string> tests = {
        "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string",
        "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne",
        "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in", "sameas", "lower", "upper"};
    return tests.count(n) > 0;
  }
  static void check_filter(const Expr& f) {
    static const std::set<std::string> filters = {
        "trim", "length", "count", "tojson", "upper", "lower", "default", "d", "first", "last", "join", "replace",
        "list", "string", "int", "float", "items", "capitalize", "title", "abs", "round", "safe", "map", "select",
        "reject", "selectattr", "rejectattr", "unique", "reverse", "sort", "wordcount", "indent", "center", "format", "sum",
        "min", "max"};
    if (!filters.count(f.name))
      fail(f.pos, "unsupported construct: filter '" + f.name + "' (not in corelm's chat-template subset)");
  }

  // Records the height of a composite node, refusing trees taller than Limits::kMaxHeight (which
  // keeps evaluation and destruction recursion bounded whatever the source).
  ExprP fin(ExprP e) {
    int h = 0;
    for (const auto& k : e->kids)
      if (k) h = std::max(h, k->height);
    e->height = h + 1;
    if (e->height > Limits::kMaxHeight)
      fail(e->pos, "expression nested too deeply (more than " + std::to_string(Limits::kMaxHeight) + " levels)");
    return e;
  }

  // `a, b` without brackets (set's right-hand side) is a tuple.
  ExprP tuple_or_expr() {
    const Pos p = cur().pos;
    ExprP first = expression();
    if (!is_op(",")) return first;
    ExprP t = node(Expr::K::Tuple, p);
    t->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++k_;
      if (cur().t == Token::T::BlockEnd) break;
      t->kids.push_back(expression());
    }
    return t;
  }

  ExprP expression() { return cond_expr(true); }

  ExprP cond_expr(bool with_cond) {
    Depth d(depth_, cur().pos);
    ExprP e = or_expr();
    while (with_cond && is_name("if")) {
      const Pos p = cur().pos;
      ++k_;
      ExprP c = node(Expr::K::Cond, p);
      c->kids.push_back(or_expr());
      c->kids.push_back(std::move(e));
      if (is_name("else")) {
        ++k_;
        c->kids.push_back(cond_expr(true));
      } else {
        c->kids.push_back(nullptr);
      }
      e = fin(std::move(c));
    }
    return e;
  }

  ExprP binary(Expr::K k, ExprP a, ExprP b, Pos p, std::string op = {}) {
    ExprP e = node(k, p);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return fin(std::move(e));
  }

  // One left-associative precedence level: `operand (op operand)*`, where `op_here` returns the
  // operator token at the cursor ("" for none). Only K::Binary nodes keep the operator's name.
  template <class Operand, class OpHere>
  ExprP left_assoc(Expr::K k, Operand operand, OpHere op_here) {
    ExprP e = operand();
    for (std::string op; !(op = op_here()).empty();) {
      const Pos p = cur().pos;
      ++k_;
      e = binary(k, std::move(e), operand(), p, k == Expr::K::Binary ? op : std::string());
    }
    return e;
  }
  std::string op_among(std::initializer_list<const char*> ops) const {
    for (const char* o : ops)
      if (is_op(o)) return o;
    return {};
  }

  ExprP or_expr() {
    return left_assoc(Expr::K::Or, [this] { return and_expr(); }, [this] { return std::string(is_name("or") ? "or" : ""); });
  }
  ExprP and_expr() {
    return left_assoc(Expr::K::And, [this] { return not_expr(); },
                      [this] { return std::string(is_name("and") ? "and" : ""); });
  }
  ExprP not_expr() {
    if (is_name("not")) {
      Depth d(depth_, cur().pos);
      ExprP e = node(Expr::K::Not, cur().pos);
      ++k_;
      e->kids.push_back(not_expr());
      return fin(std::move(e));
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    for (;;) {
      const Pos p = cur().pos;
      std::string op;
      if (cur().t == Token::T::Op && (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == "<=" ||
                                      cur().s == ">" || cur().s == ">=")) {
        op = cur().s;
        ++k_;
      } else if (is_name("in")) {
        op = "in";
        ++k_;
      } else if (is_name("not") && peek().t == Token::T::Name && peek().s == "in") {
        op = "notin";
        k_ += 2;
      } else {
        return e;
      }
      // jinja2 chains comparisons (a < b < c); chained ones are rare in templates: each
      // comparison here takes the previous result, which differs only for chains.
      if (e->k == Expr::K::Binary && (e->name == "==" || e->name == "!=" || e->name == "<" || e->name == "<=" ||
                                      e->name == ">" || e->name == ">=" || e->name == "in" || e->name == "notin") &&
          !parenthesized_.count(e.get()))
        fail(p, "unsupported construct: a chained comparison");
      e = binary(Expr::K::Binary, std::move(e), math1(), p, op);
    }
  }
  ExprP math1() {
    return left_assoc(Expr::K::Binary, [this] { return concat(); }, [this] { return op_among({"+", "-"}); });
  }
  ExprP concat() {
    return left_assoc(Expr::K::Binary, [this] { return math2(); }, [this] { return op_among({"~"}); });
  }
  ExprP math2() {
    return left_assoc(Expr::K::Binary, [this] { return pow_expr(); }, [this] { return op_among({"*", "/", "//", "%"}); });
  }
  ExprP pow_expr() {
    return left_assoc(Expr::K::Binary, [this] { return unary(true); }, [this] { return op_among({"**"}); });
  }
  ExprP unary(bool with_filter) {
    Depth d(depth_, cur().pos);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? Expr::K::Neg : Expr::K::Pos, cur().pos);
      ++k_;
      e->kids.push_back(unary(false));
      e = fin(std::move(e));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprP primary() {
    const Token tk = cur();
    switch (tk.t) {
      case Token::T::Name: {
        ++k_;
        if (tk.s == "true" || tk.s == "True" || tk.s == "false" || tk.s == "False") {
          ExprP e = node(Expr::K::Literal, tk.pos);
          e->value = Value::boolean(tk.s == "true" || tk.s == "True");
          return e;
        }
        if (tk.s == "none" || tk.s == "None") {
          ExprP e = node(Expr::K::Literal, tk.pos);
          e->value = Value::none();
          return e;
        }
        ExprP e = node(Expr::K::Name, tk.pos);
        e->name = tk.s;
        return e;
      }
      case Token::T::String: {
        std::string s;
        while (cur().t == Token::T::String) s += t_[k_++].s;  // adjacent literals concatenate
        ExprP e = node(Expr::K::Literal, tk.pos);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Token::T::Int: {
        ++k_;
        ExprP e = node(Expr::K::Literal, tk.pos);
        errno = 0;
        char* endp = nullptr;
        const long long v = std::strtoll(tk.s.c_str(), &endp, 10);
        if (errno == ERANGE) fail(tk.pos, "integer literal " + tk.s + " is out of range");
        e->value = Value::integer(v);
        return e;
      }
      case Token::T::Float: {
        ++k_;
        ExprP e = node(Expr::K::Literal, tk.pos);
        e->value = Value::real(std::strtod(tk.s.c_str(), nullptr));
        return e;
      }
      case Token::T::Op:
        if (tk.s == "(") {
          ++k_;
          if (is_op(")")) {
            ++k_;
            return node(Expr::K::Tuple, tk.pos);
          }
          ExprP first = expression();
          if (is_op(")")) {
            ++k_;
            parenthesized_.insert(first.get());
            return first;
          }
          ExprP t = node(Expr::K::Tuple, tk.pos);
          t->kids.push_back(std::move(first));
          while (is_op(",")) {
            ++k_;
            if (is_op(")")) break;
            t->kids.push_back(expression());
          }
          expect_op(")");
          return fin(std::move(t));
        }
        if (tk.s == "[") {
          ++k_;
          ExprP l = node(Expr::K::List, tk.pos);
          while (!is_op("]")) {
            if (!l->kids.empty()) expect_op(",");
            if (is_op("]")) break;
            l->kids.push_back(expression());
          }
          ++k_;
          return fin(std::move(l));
        }
        if (tk.s == "{") {
          ++k_;
          ExprP d = node(Expr::K::Dict, tk.pos);
          while (!is_op("}")) {
            if (!d->kids.empty()) expect_op(",");
            if (is_op("}")) break;
            d->kids.push_back(expression());
            expect_op(":");
            d->kids.push_back(expression());
          }
          ++k_;
          return fin(std::move(d));
        }
        break;
      default:
        break;
    }
    fail(tk.pos, "unexpected " + describe(tk) + " in an expression");
  }

  // Arguments of a call or filter: positional, then name=value.
  void arguments(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur().pos, "unsupported construct: *args / **kwargs in a call");
      if (cur().t == Token::T::Name && peek().t == Token::T::Op && peek().s == "=") {
        e.kwarg_names.push_back(cur().s);
        k_ += 2;
        e.kids.push_back(expression());
      } else {
        if (!e.kwarg_names.empty()) fail(cur().pos, "a positional argument after a keyword argument");
        e.kids.push_back(expression());
      }
    }
    ++k_;
  }

  ExprP postfix(ExprP e) {
    for (;;) {
      const Pos p = cur().pos;
      if (is_op(".")) {
        ++k_;
        if (cur().t == Token::T::Name) {
          ExprP a = node(Expr::K::Attr, p);
          a->name = cur().s;
          ++k_;
          a->kids.push_back(std::move(e));
          e = std::move(a);
        } else if (cur().t == Token::T::Int) {
          ExprP a = node(Expr::K::Item, p);
          a->kids.push_back(std::move(e));
          ExprP idx = node(Expr::K::Literal, cur().pos);
          idx->value = Value::integer(std::strtoll(cur().s.c_str(), nullptr, 10));
          ++k_;
          a->kids.push_back(std::move(idx));
          e = std::move(a);
        } else {
          fail(cur().pos, "expected an attribute name after '.', got " + describe(cur()));
        }
      } else if (is_op("[")) {
        ++k_;
        ExprP start, stop, step;
        bool slice = false;
        if (!is_op(":")) start = expression();
        if (is_op(":")) {
          slice = true;
          ++k_;
          if (!is_op("]") && !is_op(":")) stop = expression();
          if (is_op(":")) {
            ++k_;
            if (!is_op("]")) step = expression();
          }
        } else if (is_op(",")) {
          fail(cur().pos, "unsupported construct: a tuple subscript");
        }
        expect_op("]");
        ExprP a = node(slice ? Expr::K::Slice : Expr::K::Item, p);
        a->kids.push_back(std::move(e));
        a->kids.push_back(std::move(start));
        if (slice) {
          a->kids.push_back(std::move(stop));
          a->kids.push_back(std::move(step));
        }
        e = std::move(a);
      } else if (is_op("(")) {
        const Pos callee = e->pos;
        e = call(std::move(e), callee);
      } else {
        return e;
      }
      e = fin(std::move(e));
    }
  }

  ExprP filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        ++k_;
        e = filter(std::move(e));
      } else if (is_name("is")) {
        const Pos p = cur().pos;
        ++k_;
        ExprP t = node(Expr::K::Test, p);
        if (is_name("not")) {
          t->negated = true;
          ++k_;
        }
        if (cur().t != Token::T::Name) fail(cur().pos, "expected a test name after 'is', got " + describe(cur()));
        t->name = cur().s;
        ++k_;
        if (!known_test(t->name)) fail(t->pos, "unsupported construct: test '" + t->name + "' (not in corelm's chat-template subset)");
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          arguments(*t);
        } else if (cur().t == Token::T::String || cur().t == Token::T::Int || cur().t == Token::T::Float ||
                   (cur().t == Token::T::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                    !is_name("is") && !is_name("in") && !is_name("not") && !is_name("if")) ||
                   is_op("[") || is_op("{")) {
          // `x is divisibleby 3` / `x is sameas none`: one argument without parentheses (jinja2's parse_test).
          Depth d(depth_, cur().pos);
          t->kids.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e), cur().pos);
      } else {
        return e;
      }
      e = fin(std::move(e));
    }
  }

  // `callee(arguments)`, the cursor on '('.
  ExprP call(ExprP callee, Pos p) {
    ExprP c = node(Expr::K::Call, p);
    c->kids.push_back(std::move(callee));
    arguments(*c);
    return c;
  }

  ExprP filter(ExprP operand) {
    if (cur().t != Token::T::Name) fail(cur().pos, "expected a filter name after '|', got " + describe(cur()));
    ExprP f = node(Expr::K::Filter, cur().pos);
    f->name = cur().s;
    ++k_;
    f->kids.push_back(std::move(operand));
    if (is_op("(")) arguments(*f);
    check_filter(*f);
    return f;
  }

  std::vector<Token> t_;
  size_t k_ = 0;
  int depth_ = 0;
  std::vector<std::pair<std::string, Pos>> open_;
  std::set<const Expr*> parenthesized_;
};

}  // namespace

Program parse(const std::string& source) {
  if (source.size() > Limits::kMaxSourceBytes)
    throw TemplateError("chat template: " + std::to_string(source.size()) + " bytes is more than the " +
                        std::to_string(Limits::kMaxSourceBytes) + " a template may hold");
  return Parser(Lexer(source).run()).program();
}

}  // namespace corelm::infer::jinja
