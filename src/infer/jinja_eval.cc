// The evaluator: walks the parsed template with Python/jinja2 semantics (see jinja_value.h), the
// globals transformers gives a chat template (raise_exception, strftime_now, plus jinja2's range,
// dict, namespace) and the filters, tests and methods of the subset. Every failure is a
// TemplateError whose message starts with the line:column of the construct that failed.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>
#include <unordered_map>

#include "corelm/chat_template.h"
#include "infer/jinja_ast.h"

namespace corelm::infer::jinja {
namespace {

[[noreturn]] void fail(Pos p, const std::string& msg) { throw TemplateError(where(p) + msg); }

enum class Flow { Normal, Break, Continue };

// Arguments of a call / filter / test after evaluation.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, const char* name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

std::string ascii_lower(const std::string& s) { return py_lower(s); }
std::string ascii_upper(const std::string& s) { return py_upper(s); }

// Python's str.title(): a cased character after an uncased one is upper-cased, others lowered.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const std::string& ch : utf8_chars(s)) {
    const bool cased = py_cased(ch);
    out += cased ? (prev_cased ? py_lower(ch) : py_upper(ch)) : ch;
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  const auto cs = utf8_chars(s);
  std::string out;
  for (size_t k = 0; k < cs.size(); ++k) out += k == 0 ? py_upper(cs[k]) : py_lower(cs[k]);
  return out;
}

// jinja2's `title` filter: the first character of every word (split at whitespace, - ( { [ <)
// upper-cased, the rest lowered.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const std::string& ch : utf8_chars(s)) {
    const bool sep = space_at(ch, 0) != 0 || ch == "-" || ch == "(" || ch == "{" || ch == "[" || ch == "<";
    if (sep) {
      out += ch;
      word_start = true;
    } else {
      out += word_start ? py_upper(ch) : py_lower(ch);
      word_start = false;
    }
  }
  return out;
}

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  const std::vector<std::string> cs = utf8_chars(s);
  const std::vector<std::string> set = utf8_chars(chars);
  auto in = [&](const std::string& c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && in(cs[b])) ++b;
  if (right)
    while (e > b && in(cs[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cs[k];
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character (and at both ends)
    const auto cs = utf8_chars(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cs.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < cs.size()) out += cs[k];
    }
    return out;
  }
  size_t i = 0;
  int64_t n = 0;
  for (;;) {
    const size_t j = (count >= 0 && n >= count) ? std::string::npos : s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    ++n;
    if (out.size() > Limits::kMaxOutputBytes) break;
  }
  out.append(s, i, std::string::npos);
  return out;
}

// json.dumps as transformers' tojson calls it (ensure_ascii=False unless asked, no key sorting
// unless asked, indent / separators as given).
struct JsonStyle {
  std::optional<std::string> indent;
  std::string item_sep = ", ", key_sep = ": ";
  bool ensure_ascii = false, sort_keys = false;
};

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (ensure_ascii && c >= 0x80) {
      // Decode one UTF-8 sequence; \uXXXX (surrogate pairs above the BMP).
      uint32_t cp = 0;
      size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (i + n > s.size()) n = 1;
      if (n == 1) {
        cp = c;
      } else {
        cp = c & (0x7F >> n);
        for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      }
      i += n - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

void to_json(const Value& v, const JsonStyle& st, int level, std::string& out, Pos p) {
  if (out.size() > Limits::kMaxOutputBytes) fail(p, "tojson: output larger than the render limit");
  if (level > 1024) fail(p, "tojson: value nested too deeply");
  auto newline = [&](int lv) {
    if (!st.indent) return;
    out += '\n';
    for (int k = 0; k < lv; ++k) out += *st.indent;
  };
  switch (v.t) {
    case Value::T::None: out += "null"; return;
    case Value::T::Bool: out += v.b ? "true" : "false"; return;
    case Value::T::Int: out += std::to_string(v.i); return;
    case Value::T::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      return;
    case Value::T::String: json_string(v.s, st.ensure_ascii, out); return;
    case Value::T::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        to_json((*v.list)[k], st, level + 1, out, p);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::T::Dict: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        json_string(items[k]->first, st.ensure_ascii, out);
        out += st.key_sep;
        to_json(items[k]->second, st, level + 1, out, p);
      }
      newline(level);
      out += '}';
      return;
    }
    default: fail(p, "tojson: Object of type " + type_name(v) + " is not JSON serializable");
  }
}

// Python's printf-style `fmt % args` for the conversions templates use: %s %r %d %i %f %% (with
// an optional precision for %f, e.g. %.2f). Anything else is a TemplateError.
std::string percent_format(const std::string& fmt, const List& args, Pos p) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail(p, "incomplete format: a '%' at the end");
    int precision = -1;
    if (fmt[i] == '.') {
      precision = 0;
      while (++i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])) && precision < 100)
        precision = precision * 10 + (fmt[i] - '0');
      if (i >= fmt.size()) fail(p, "incomplete format");
    }
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) fail(p, "not enough arguments for format string");
    const Value& a = args[next++];
    if (c == 's') {
      out += to_str(a);
    } else if (c == 'r') {
      out += repr(a);
    } else if (c == 'd' || c == 'i') {
      if (!a.is_number()) fail(p, "%" + std::string(1, c) + " format: a real number is required, not " + type_name(a));
      out += std::to_string(a.t == Value::T::Float ? static_cast<int64_t>(a.f) : a.t == Value::T::Bool ? a.b : a.i);
    } else if (c == 'f') {
      if (!a.is_number()) fail(p, "%f format: a real number is required, not " + type_name(a));
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", precision < 0 ? 6 : precision,
                    a.t == Value::T::Float ? a.f : static_cast<double>(a.t == Value::T::Bool ? a.b : a.i));
      out += buf;
    } else {
      fail(p, std::string("unsupported construct: format conversion '%") + c + "'");
    }
    if (out.size() > Limits::kMaxOutputBytes) fail(p, "formatted string larger than the render limit");
  }
  if (next < args.size()) fail(p, "not all arguments converted during string formatting");
  return out;
}

// Python's slice.indices(): clamps start/stop for a sequence of length n.
void slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step, int64_t& b,
                   int64_t& e) {
  auto adjust = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  b = adjust(start, step < 0 ? n - 1 : 0);
  e = adjust(stop, step < 0 ? -1 : n);
}

class Renderer {
 public:
  template <class J>
  Renderer(const J& context, std::string& out) : out_(out) {
    frames_.emplace_back();
    auto& g = frames_.back();
    for (const char* f : {"raise_exception", "strftime_now", "range", "dict", "namespace"})
      g[f] = Value::callable(f);
    if (context.is_object())
      for (auto it = context.begin(); it != context.end(); ++it) g[it.key()] = from_json(it.value());
    frames_.emplace_back();  // the template's own top-level `set`s
  }

  void run(const Body& body) { exec(body); }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  void step(Pos p) {
    if (++steps_ > Limits::kMaxSteps)
      fail(p, "template too expensive: more than " + std::to_string(Limits::kMaxSteps) + " evaluation steps");
  }
  void emit(const std::string& s, Pos p) {
    if (out_.size() + s.size() > Limits::kMaxOutputBytes)
      fail(p, "rendered text larger than " + std::to_string(Limits::kMaxOutputBytes) + " bytes");
    out_ += s;
  }
  static void check_size(size_t n, Pos p) {
    if (n > Limits::kMaxOutputBytes) fail(p, "string larger than " + std::to_string(Limits::kMaxOutputBytes) + " bytes");
  }

  const Value* lookup(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      auto it = f->find(name);
      if (it != f->end()) return &it->second;
    }
    return nullptr;
  }

  // Using an Undefined for anything but printing, testing or truthiness: jinja2's UndefinedError.
  [[noreturn]] static void undefined_error(const Value& v, Pos p) { fail(p, v.s.empty() ? "undefined value" : v.s); }

  Flow exec(const Body& body) {
    for (const auto& n : body) {
      const Flow f = exec(*n);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n) {
    step(n.pos);
    switch (n.k) {
      case Node::K::Text: emit(n.text, n.pos); return Flow::Normal;
      case Node::K::Output: emit(to_str(eval(*n.expr)), n.pos); return Flow::Normal;
      case Node::K::If:
        for (size_t k = 0; k < n.conditions.size(); ++k)
          if (truthy(eval(*n.conditions[k]))) return exec(n.bodies[k]);
        if (n.bodies.size() > n.conditions.size()) return exec(n.bodies.back());
        return Flow::Normal;
      case Node::K::For: return exec_for(n);
      case Node::K::Set: {
        Value v = eval(*n.expr);
        assign(n, std::move(v));
        return Flow::Normal;
      }
      case Node::K::SetBlock: {
        std::string captured;
        std::swap(captured, out_);
        const size_t before_steps = steps_;
        (void)before_steps;
        try {
          exec(n.bodies[0]);
        } catch (...) {
          std::swap(captured, out_);
          throw;
        }
        std::swap(captured, out_);
        frames_.back()[n.targets[0]] = Value::string(std::move(captured));
        return Flow::Normal;
      }
      case Node::K::Break: return Flow::Break;
      case Node::K::Continue: return Flow::Continue;
      case Node::K::Scope: return exec(n.bodies[0]);
    }
    return Flow::Normal;
  }

  // A stored value may not nest without bound (`{% set x = [x] %}` in a loop), and a namespace
  // may not end up inside a namespace (a reference cycle).
  static void check_storable(const Value& v, Pos p) {
    if (v.depth > kMaxValueDepth)
      fail(p, "value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  static bool holds_namespace(const Value& v) {
    if (v.t == Value::T::Namespace) return true;
    if (v.t == Value::T::Callable) return v.self && holds_namespace(*v.self);
    if (v.t == Value::T::List) return std::any_of(v.list->begin(), v.list->end(), holds_namespace);
    if (v.t == Value::T::Dict)
      return std::any_of(v.dict->begin(), v.dict->end(), [](const auto& kv) { return holds_namespace(kv.second); });
    return false;
  }

  void assign(const Node& n, Value v) {
    check_storable(v, n.pos);
    if (!n.attr.empty()) {
      if (holds_namespace(v))
        fail(n.pos, "unsupported construct: storing a namespace inside namespace attribute '" + n.attr + "'");
      const Value* ns = lookup(n.targets[0]);
      if (!ns || ns->t != Value::T::Namespace)
        fail(n.pos, "cannot assign attribute '" + n.attr + "' on " + (ns ? "a " + type_name(*ns) : "undefined '" + n.targets[0] + "'") +
                        " (only a namespace() can be assigned to)");
      for (auto& [k, val] : *ns->ns)
        if (k == n.attr) {
          val = std::move(v);
          return;
        }
      ns->ns->emplace_back(n.attr, std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      frames_.back()[n.targets[0]] = std::move(v);
      return;
    }
    const List items = iterate(v, n.pos);
    if (items.size() != n.targets.size())
      fail(n.pos, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(n.targets.size()) + " names");
    for (size_t k = 0; k < items.size(); ++k) frames_.back()[n.targets[k]] = items[k];
  }

  void bind_targets(const Node& n, const Value& item, Frame& f) {
    if (n.targets.size() == 1) {
      f[n.targets[0]] = item;
      return;
    }
    const List parts = iterate(item, n.pos);
    if (parts.size() != n.targets.size())
      fail(n.pos, "cannot unpack " + std::to_string(parts.size()) + " values into the " +
                      std::to_string(n.targets.size()) + " loop variables");
    for (size_t k = 0; k < parts.size(); ++k) f[n.targets[k]] = parts[k];
  }

  Flow exec_for(const Node& n) {
    if (++depth_ > Limits::kMaxNesting) fail(n.pos, "loops nested too deeply");
    struct Unnest {
      int& d;
      ~Unnest() { --d; }
    } unnest{depth_};
    List items = iterate(eval(*n.expr), n.pos);
    if (n.filter) {
      List kept;
      frames_.emplace_back();
      for (auto& it : items) {
        step(n.pos);
        bind_targets(n, it, frames_.back());
        if (truthy(eval(*n.filter))) kept.push_back(std::move(it));
      }
      frames_.pop_back();
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.bodies.size() > 1) return exec(n.bodies[1]);
      return Flow::Normal;
    }
    frames_.emplace_back();
    struct Pop {
      std::vector<Frame>& f;
      ~Pop() { f.pop_back(); }
    } pop{frames_};
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step(n.pos);
      Frame& f = frames_.back();
      bind_targets(n, items[static_cast<size_t>(k)], f);
      Dict loop = {{"index", Value::integer(k + 1)},
                   {"index0", Value::integer(k)},
                   {"revindex", Value::integer(len - k)},
                   {"revindex0", Value::integer(len - k - 1)},
                   {"first", Value::boolean(k == 0)},
                   {"last", Value::boolean(k == len - 1)},
                   {"length", Value::integer(len)},
                   {"depth", Value::integer(1)},
                   {"depth0", Value::integer(0)},
                   {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item")},
                   {"nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item")},
                   {"cycle", Value::callable("loop.cycle", Value::integer(k))}};
      f["loop"] = Value::of_dict(std::move(loop));
      if (exec(n.bodies[0]) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // Python iteration: a list's items, a dict's keys, a string's characters; Undefined is empty.
  List iterate(const Value& v, Pos p) {
    switch (v.t) {
      case Value::T::Undefined: return {};
      case Value::T::List: return *v.list;
      case Value::T::Dict: {
        List keys;
        for (const auto& [k, val] : *v.dict) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::T::String: {
        List chars;
        for (auto& c : utf8_chars(v.s)) chars.push_back(Value::string(std::move(c)));
        return chars;
      }
      default: fail(p, "'" + type_name(v) + "' object is not iterable");
    }
  }

  static int64_t as_int(const Value& v, Pos p, const std::string& what) {
    if (v.t == Value::T::Int) return v.i;
    if (v.t == Value::T::Bool) return v.b;
    fail(p, what + " must be an integer, got " + type_name(v));
  }
  static double as_float(const Value& v) { return v.t == Value::T::Float ? v.f : v.t == Value::T::Bool ? v.b : static_cast<double>(v.i); }

  Value eval(const Expr& e) {
    step(e.pos);
    switch (e.k) {
      case Expr::K::Literal: return e.value;
      case Expr::K::Name: {
        const Value* v = lookup(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::K::List:
      case Expr::K::Tuple: {
        List l;
        for (const auto& k : e.kids) l.push_back(eval(*k));
        return e.k == Expr::K::Tuple ? Value::tuple(std::move(l)) : Value::of_list(std::move(l));
      }
      case Expr::K::Dict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          Value key = eval(*e.kids[k]);
          if (key.t != Value::T::String) fail(e.kids[k]->pos, "unsupported construct: a dict key that is not a string");
          Value val = eval(*e.kids[k + 1]);
          bool replaced = false;
          for (auto& [dk, dv] : d)
            if (dk == key.s) {
              dv = val;
              replaced = true;
            }
          if (!replaced) d.emplace_back(key.s, std::move(val));
        }
        return Value::of_dict(std::move(d));
      }
      case Expr::K::Attr: return get_attr(eval(*e.kids[0]), e.name, e.pos);
      case Expr::K::Item: return get_item(eval(*e.kids[0]), eval(*e.kids[1]), e.pos);
      case Expr::K::Slice: return slice(e);
      case Expr::K::Call: return call(e);
      case Expr::K::Filter: {
        Value operand = eval(*e.kids[0]);
        Args a = args_of(e, 1);
        return filter(e.name, std::move(operand), a, e.pos);
      }
      case Expr::K::Test: {
        Value operand = eval(*e.kids[0]);
        Args a = args_of(e, 1);
        const bool r = test(e.name, operand, a, e.pos);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::K::Neg:
      case Expr::K::Pos: {
        Value v = eval(*e.kids[0]);
        if (v.is_undefined()) undefined_error(v, e.pos);
        if (!v.is_number()) fail(e.pos, "bad operand type for unary " + std::string(e.k == Expr::K::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
        if (e.k == Expr::K::Pos) return v.t == Value::T::Bool ? Value::integer(v.b) : v;
        if (v.t == Value::T::Float) return Value::real(-v.f);
        const int64_t x = v.t == Value::T::Bool ? v.b : v.i;
        if (x == INT64_MIN) fail(e.pos, "integer overflow");
        return Value::integer(-x);
      }
      case Expr::K::Not: return Value::boolean(!truthy(eval(*e.kids[0])));
      case Expr::K::And: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? eval(*e.kids[1]) : a;
      }
      case Expr::K::Or: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case Expr::K::Cond:
        if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : Value::undefined("the inline if-expression evaluated to false and has no else");
      case Expr::K::Binary: return binary(e.name, eval(*e.kids[0]), eval(*e.kids[1]), e.pos);
    }
    fail(e.pos, "unsupported expression");
  }

  Args args_of(const Expr& e, size_t first) {
    Args a;
    const size_t n_kw = e.kwarg_names.size();
    const size_t n_pos = e.kids.size() - first - n_kw;
    for (size_t k = 0; k < n_pos; ++k) a.pos.push_back(eval(*e.kids[first + k]));
    for (size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(e.kwarg_names[k], eval(*e.kids[first + n_pos + k]));
    return a;
  }

  static bool is_str_method(const std::string& n) {
    static const char* const m[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower",
                                    "title", "capitalize", "replace", "find", "count", "join", "isdigit", "isspace"};
    return std::find_if(std::begin(m), std::end(m), [&](const char* x) { return n == x; }) != std::end(m);
  }

  // jinja2's getattr: the Python attribute (a method), else the item of that name.
  Value get_attr(const Value& obj, const std::string& name, Pos p) {
    switch (obj.t) {
      case Value::T::Undefined: undefined_error(obj, p);
      case Value::T::Dict:
        if (name == "items" || name == "keys" || name == "values" || name == "get")
          return Value::callable("dict." + name, obj);
        if (const Value* v = obj.find(name)) return *v;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      case Value::T::Namespace:
        if (const Value* v = obj.find(name)) return *v;
        return Value::undefined("'Namespace object' has no attribute '" + name + "'");
      case Value::T::String:
        if (is_str_method(name)) return Value::callable("str." + name, obj);
        return Value::undefined("'str object' has no attribute '" + name + "'");
      default: return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
    }
  }

  // jinja2's getitem: obj[key], else the attribute when the key is a string.
  Value get_item(const Value& obj, const Value& key, Pos p) {
    if (obj.is_undefined()) undefined_error(obj, p);
    if ((obj.t == Value::T::List || obj.t == Value::T::String) && (key.t == Value::T::Int || key.t == Value::T::Bool)) {
      const int64_t i = key.t == Value::T::Bool ? key.b : key.i;
      if (obj.t == Value::T::List) {
        const auto n = static_cast<int64_t>(obj.list->size());
        const int64_t j = i < 0 ? i + n : i;
        if (j < 0 || j >= n) return Value::undefined("list object has no element " + std::to_string(i));
        return (*obj.list)[static_cast<size_t>(j)];
      }
      const auto cs = utf8_chars(obj.s);
      const auto n = static_cast<int64_t>(cs.size());
      const int64_t j = i < 0 ? i + n : i;
      if (j < 0 || j >= n) return Value::undefined("str object has no element " + std::to_string(i));
      return Value::string(cs[static_cast<size_t>(j)]);
    }
    if ((obj.t == Value::T::Dict || obj.t == Value::T::Namespace) && key.t == Value::T::String) {
      if (obj.t == Value::T::Dict)
        if (const Value* v = obj.find(key.s)) return *v;
      return get_attr(obj, key.s, p);
    }
    if (key.t == Value::T::String) return get_attr(obj, key.s, p);
    return Value::undefined("'" + type_name(obj) + " object' has no element " + to_str(key));
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.kids[0]);
    auto bound = [&](const ExprP& x) -> std::optional<int64_t> {
      if (!x) return std::nullopt;
      const Value v = eval(*x);
      if (v.t == Value::T::None) return std::nullopt;
      return as_int(v, x->pos, "a slice index");
    };
    const auto start = bound(e.kids[1]), stop = bound(e.kids[2]), stp = bound(e.kids[3]);
    const int64_t step_v = stp.value_or(1);
    if (step_v == 0) fail(e.pos, "slice step cannot be zero");
    if (obj.is_undefined()) undefined_error(obj, e.pos);
    std::vector<std::string> chars;
    const bool is_str = obj.t == Value::T::String;
    if (is_str) chars = utf8_chars(obj.s);
    else if (obj.t != Value::T::List) fail(e.pos, "'" + type_name(obj) + "' object is not subscriptable with a slice");
    const auto n = static_cast<int64_t>(is_str ? chars.size() : obj.list->size());
    int64_t b, en;
    slice_indices(n, start, stop, step_v, b, en);
    List l;
    std::string s;
    for (int64_t k = b; step_v > 0 ? k < en : k > en; k += step_v) {
      if (is_str) s += chars[static_cast<size_t>(k)];
      else l.push_back((*obj.list)[static_cast<size_t>(k)]);
    }
    return is_str ? Value::string(std::move(s)) : Value::of_list(std::move(l));
  }

  Value call(const Expr& e) {
    const Value fn = eval(*e.kids[0]);
    if (fn.is_undefined()) undefined_error(fn, e.pos);
    if (fn.t != Value::T::Callable) fail(e.pos, "'" + type_name(fn) + "' object is not callable");
    Args a = args_of(e, 1);
    const std::string& name = fn.s;
    const Value& self = *fn.self;
    auto arg = [&](size_t i, const char* kw) { return a.get(i, kw); };
    auto str_arg = [&](size_t i, const char* kw) -> std::optional<std::string> {
      const Value* v = arg(i, kw);
      if (!v || v->t == Value::T::None) return std::nullopt;
      if (v->t != Value::T::String) fail(e.pos, name + "() argument must be a str, got " + type_name(*v));
      return v->s;
    };
    if (name == "raise_exception") {
      const Value* m = arg(0, "message");
      fail(e.pos, m ? to_str(*m) : std::string("raise_exception() called"));
    }
    if (name == "strftime_now") {
      const Value* f = arg(0, "format");
      if (!f || f->t != Value::T::String) fail(e.pos, "strftime_now() needs a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      const size_t n = f->s.size() < 200 ? std::strftime(buf, sizeof buf, f->s.c_str(), &tm) : 0;
      if (n == 0 && !f->s.empty()) fail(e.pos, "strftime_now(): format too long or empty result");
      return Value::string(std::string(buf, n));
    }
    if (name == "range") {
      std::vector<int64_t> v;
      for (const auto& x : a.pos) v.push_back(as_int(x, e.pos, "range() argument"));
      if (v.empty() || v.size() > 3 || !a.kw.empty()) fail(e.pos, "range() takes 1 to 3 integer arguments");
      const int64_t start = v.size() == 1 ? 0 : v[0], stop = v.size() == 1 ? v[0] : v[1], st = v.size() == 3 ? v[2] : 1;
      if (st == 0) fail(e.pos, "range() arg 3 must not be zero");
      List l;
      for (int64_t k = start; st > 0 ? k < stop : k > stop; k += st) {
        if (l.size() >= Limits::kMaxItems) fail(e.pos, "range() longer than " + std::to_string(Limits::kMaxItems) + " items");
        l.push_back(Value::integer(k));
      }
      return Value::of_list(std::move(l));
    }
    if (name == "dict" || name == "namespace") {
      Dict d;
      if (!a.pos.empty()) {
        if (a.pos.size() > 1 || (a.pos[0].t != Value::T::Dict && a.pos[0].t != Value::T::Namespace))
          fail(e.pos, name + "() takes a mapping and keyword arguments");
        d = a.pos[0].t == Value::T::Dict ? *a.pos[0].dict : *a.pos[0].ns;
      }
      for (auto& [k, v] : a.kw) {
        bool replaced = false;
        for (auto& [dk, dv] : d)
          if (dk == k) dv = v, replaced = true;
        if (!replaced) d.emplace_back(k, v);
      }
      if (name == "dict") return Value::of_dict(std::move(d));
      Value ns;
      ns.t = Value::T::Namespace;
      ns.ns = std::make_shared<Dict>(std::move(d));
      return ns;
    }
    if (name == "loop.cycle") {
      if (a.pos.empty()) fail(e.pos, "loop.cycle() needs at least one argument");
      return a.pos[static_cast<size_t>(self.i) % a.pos.size()];
    }
    if (name == "dict.items" || name == "dict.keys" || name == "dict.values") {
      List l;
      for (const auto& [k, v] : *self.dict) {
        if (name == "dict.items") l.push_back(Value::tuple({Value::string(k), v}));
        else if (name == "dict.keys") l.push_back(Value::string(k));
        else l.push_back(v);
      }
      return Value::of_list(std::move(l));
    }
    if (name == "dict.get") {
      const Value* k = arg(0, "key");
      if (!k) fail(e.pos, "get() needs a key");
      if (k->t == Value::T::String)
        if (const Value* v = self.find(k->s)) return *v;
      const Value* d = arg(1, "default");
      return d ? *d : Value::none();
    }
    // str methods
    const std::string& s = self.s;
    if (name == "str.strip" || name == "str.lstrip" || name == "str.rstrip") {
      const bool l = name != "str.rstrip", r = name != "str.lstrip";
      const auto chars = str_arg(0, "chars");
      return Value::string(chars ? strip_chars(s, *chars, l, r) : py_strip(s, l, r));
    }
    if (name == "str.upper") return Value::string(ascii_upper(s));
    if (name == "str.lower") return Value::string(ascii_lower(s));
    if (name == "str.title") return Value::string(py_title(s));
    if (name == "str.capitalize") return Value::string(py_capitalize(s));
    if (name == "str.isdigit") return Value::boolean(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
    if (name == "str.isspace") return Value::boolean(!s.empty() && py_strip(s, true, false).empty());
    if (name == "str.startswith" || name == "str.endswith") {
      const Value* x = arg(0, "prefix");
      if (!x) fail(e.pos, name.substr(4) + "() takes at least 1 argument");
      List options = x->t == Value::T::List ? *x->list : List{*x};
      for (const auto& o : options) {
        if (o.t != Value::T::String) fail(e.pos, name.substr(4) + "() argument must be str or a tuple of str, got " + type_name(o));
        if (name == "str.startswith" ? s.starts_with(o.s) : s.ends_with(o.s)) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "str.replace") {
      const auto from = str_arg(0, "old"), to = str_arg(1, "new");
      if (!from || !to) fail(e.pos, "replace() takes 2 string arguments");
      const Value* c = arg(2, "count");
      return checked(Value::string(replace_all(s, *from, *to, c ? as_int(*c, e.pos, "count") : -1)), e.pos);
    }
    if (name == "str.find" || name == "str.count") {
      const auto sub = str_arg(0, "sub");
      if (!sub) fail(e.pos, name.substr(4) + "() takes a string argument");
      if (name == "str.find") {
        const size_t at = s.find(*sub);
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(utf8_length(s.substr(0, at))));
      }
      if (sub->empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size())) ++n;
      return Value::integer(n);
    }
    if (name == "str.split") {
      const auto sep = str_arg(0, "sep");
      const Value* mx = arg(1, "maxsplit");
      const int64_t maxsplit = mx ? as_int(*mx, e.pos, "maxsplit") : -1;
      return Value::of_list(split(s, sep, maxsplit, e.pos));
    }
    if (name == "str.join") {
      const Value* it = arg(0, "iterable");
      if (!it) fail(e.pos, "join() takes one argument");
      std::string out;
      bool first = true;
      for (const auto& x : iterate(*it, e.pos)) {
        if (x.t != Value::T::String) fail(e.pos, "join(): sequence item: expected str instance, " + type_name(x) + " found");
        if (!first) out += s;
        out += x.s;
        first = false;
        check_size(out.size(), e.pos);
      }
      return Value::string(std::move(out));
    }
    fail(e.pos, "unsupported construct: calling '" + name + "'");
  }

  static Value checked(Value v, Pos p) {
    if (v.t == Value::T::String) check_size(v.s.size(), p);
    return v;
  }

  static List split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit, Pos p) {
    List out;
    auto push = [&](std::string x) {
      if (out.size() >= Limits::kMaxItems) fail(p, "split(): more than " + std::to_string(Limits::kMaxItems) + " items");
      out.push_back(Value::string(std::move(x)));
    };
    if (sep) {
      if (sep->empty()) fail(p, "split(): empty separator");
      size_t i = 0;
      int64_t n = 0;
      for (;;) {
        const size_t j = (maxsplit >= 0 && n >= maxsplit) ? std::string::npos : s.find(*sep, i);
        if (j == std::string::npos) break;
        push(s.substr(i, j - i));
        i = j + sep->size();
        ++n;
      }
      push(s.substr(i));
      return out;
    }
    // Runs of whitespace separate; leading / trailing whitespace yields nothing.
    size_t i = 0;
    int64_t n = 0;
    for (;;) {
      while (i < s.size() && space_at(s, i)) i += space_at(s, i);
      if (i >= s.size()) break;
      if (maxsplit >= 0 && n >= maxsplit) {
        push(py_strip(s.substr(i), false, true));
        break;
      }
      size_t j = i;
      while (j < s.size() && !space_at(s, j)) ++j;
      push(s.substr(i, j - i));
      ++n;
      i = j;
    }
    return out;
  }

  Value binary(const std::string& op, const Value& a, const Value& b, Pos p) {
    if (op == "~") {
      std::string s = to_str(a) + to_str(b);
      check_size(s.size(), p);
      return Value::string(std::move(s));
    }
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "notin") {
      const bool r = contains(b, a, p);
      return Value::boolean(op == "in" ? r : !r);
    }
    if (a.is_undefined()) undefined_error(a, p);
    if (b.is_undefined()) undefined_error(b, p);
    auto type_error = [&]() -> Value {
      fail(p, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c = 0;
      if (a.is_number() && b.is_number()) {
        const double x = as_float(a), y = as_float(b);
        if (a.t != Value::T::Float && b.t != Value::T::Float) {
          const int64_t xi = a.t == Value::T::Bool ? a.b : a.i, yi = b.t == Value::T::Bool ? b.b : b.i;
          c = xi < yi ? -1 : xi > yi ? 1 : 0;
        } else {
          if (std::isnan(x) || std::isnan(y)) return Value::boolean(false);
          c = x < y ? -1 : x > y ? 1 : 0;
        }
      } else if (a.t == Value::T::String && b.t == Value::T::String) {
        c = a.s.compare(b.s);  // UTF-8 byte order is code point order
        c = c < 0 ? -1 : c > 0 ? 1 : 0;
      } else {
        fail(p, "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
      }
      return Value::boolean(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    }
    if (op == "%" && a.t == Value::T::String) {
      const List args = b.t == Value::T::List && b.b ? *b.list : List{b};  // a tuple spreads, anything else is one
      return Value::string(percent_format(a.s, args, p));
    }
    if (op == "+") {
      if (a.t == Value::T::String && b.t == Value::T::String) return checked(Value::string(a.s + b.s), p);
      if (a.t == Value::T::List && b.t == Value::T::List) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        if (l.size() > Limits::kMaxItems) fail(p, "list longer than the limit");
        return Value::of_list(std::move(l));
      }
    }
    if (op == "*") {
      const Value* seq = a.t == Value::T::String || a.t == Value::T::List ? &a : b.t == Value::T::String || b.t == Value::T::List ? &b : nullptr;
      const Value* cnt = seq == &a ? &b : &a;
      if (seq && (cnt->t == Value::T::Int || cnt->t == Value::T::Bool)) {
        const int64_t n = std::max<int64_t>(0, cnt->t == Value::T::Bool ? cnt->b : cnt->i);
        const size_t unit = seq->t == Value::T::String ? seq->s.size() : seq->list->size();
        if (unit && static_cast<uint64_t>(n) > (seq->t == Value::T::String ? Limits::kMaxOutputBytes : Limits::kMaxItems) / unit)
          fail(p, "repetition larger than the render limit");
        if (seq->t == Value::T::String) {
          std::string out;
          for (int64_t k = 0; k < n; ++k) out += seq->s;
          return Value::string(std::move(out));
        }
        List l;
        for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq->list->begin(), seq->list->end());
        return Value::of_list(std::move(l));
      }
    }
    if (!a.is_number() || !b.is_number()) return type_error();
    const bool fl = a.t == Value::T::Float || b.t == Value::T::Float;
    const int64_t x = a.t == Value::T::Bool ? a.b : a.i, y = b.t == Value::T::Bool ? b.b : b.i;
    const double fx = as_float(a), fy = as_float(b);
    int64_t r = 0;
    if (op == "+") {
      if (fl) return Value::real(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) fail(p, "integer overflow");
      return Value::integer(r);
    }
    if (op == "-") {
      if (fl) return Value::real(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) fail(p, "integer overflow");
      return Value::integer(r);
    }
    if (op == "*") {
      if (fl) return Value::real(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) fail(p, "integer overflow");
      return Value::integer(r);
    }
    if (op == "/") {
      if (fy == 0) fail(p, "division by zero");
      return Value::real(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fl) {
        if (fy == 0) fail(p, "float division by zero");
        const double m = std::fmod(fx, fy);
        const double mod = (m != 0 && ((m < 0) != (fy < 0))) ? m + fy : m;
        return op == "%" ? Value::real(mod) : Value::real(std::floor((fx - mod) / fy));
      }
      if (y == 0) fail(p, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) fail(p, "integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "%" ? m : q);
    }
    if (op == "**") {
      if (!fl && y >= 0) {
        int64_t acc = 1;
        for (int64_t k = 0; k < y; ++k)
          if (__builtin_mul_overflow(acc, x, &acc)) fail(p, "integer overflow");
        return Value::integer(acc);
      }
      return Value::real(std::pow(fx, fy));
    }
    return type_error();
  }

  bool contains(const Value& hay, const Value& needle, Pos p) {
    switch (hay.t) {
      case Value::T::Undefined: return false;
      case Value::T::String:
        if (needle.is_undefined()) undefined_error(needle, p);
        if (needle.t != Value::T::String)
          fail(p, "'in <string>' requires string as left operand, not " + type_name(needle));
        return hay.s.find(needle.s) != std::string::npos;
      case Value::T::List:
        return std::any_of(hay.list->begin(), hay.list->end(), [&](const Value& v) { return equal(v, needle); });
      case Value::T::Dict:
      case Value::T::Namespace:
        return needle.t == Value::T::String && hay.find(needle.s) != nullptr;
      default: fail(p, "argument of type '" + type_name(hay) + "' is not iterable");
    }
  }

  bool test(const std::string& name, const Value& v, const Args& a, Pos p) {
    const Value* arg = a.get(0, "value");
    auto need_arg = [&]() -> const Value& {
      if (!arg) fail(p, "test '" + name + "' needs an argument");
      return *arg;
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.t == Value::T::None;
    if (name == "boolean") return v.t == Value::T::Bool;
    if (name == "false") return v.t == Value::T::Bool && !v.b;
    if (name == "true") return v.t == Value::T::Bool && v.b;
    if (name == "integer") return v.t == Value::T::Int;
    if (name == "float") return v.t == Value::T::Float;
    if (name == "number") return v.is_number();
    if (name == "string") return v.t == Value::T::String;
    if (name == "mapping") return v.t == Value::T::Dict;
    if (name == "iterable") return v.t == Value::T::List || v.t == Value::T::Dict || v.t == Value::T::String || v.is_undefined();
    if (name == "sequence") return v.t == Value::T::List || v.t == Value::T::Dict || v.t == Value::T::String || v.is_undefined();
    if (name == "callable") return v.t == Value::T::Callable;
    if (name == "lower" || name == "upper") {
      if (v.t != Value::T::String) return false;  // jinja2: str(value).islower() -- close enough for strings
      const std::string conv = name == "lower" ? py_lower(v.s) : py_upper(v.s);
      const auto cs = utf8_chars(v.s);
      const bool cased = std::any_of(cs.begin(), cs.end(), py_cased);
      return cased && conv == v.s;
    }
    if (name == "odd" || name == "even") {
      const int64_t x = as_int(v, p, "test '" + name + "' operand");
      return name == "odd" ? (x % 2 != 0) : (x % 2 == 0);
    }
    if (name == "divisibleby") {
      const int64_t x = as_int(v, p, "divisibleby operand"), d = as_int(need_arg(), p, "divisibleby argument");
      if (d == 0) fail(p, "integer division or modulo by zero");
      return x % d == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, need_arg());
    if (name == "ne" || name == "!=") return !equal(v, need_arg());
    if (name == "sameas") {
      const Value& o = need_arg();
      if (v.t != o.t) return false;
      if (v.t == Value::T::None || v.t == Value::T::Undefined) return v.t == Value::T::None;
      if (v.t == Value::T::Bool) return v.b == o.b;
      return false;  // identity of other objects is not observable here
    }
    if (name == "in") return contains(need_arg(), v, p);
    static const std::map<std::string, std::string> cmp = {{"lt", "<"}, {"lessthan", "<"}, {"<", "<"}, {"le", "<="},
                                                           {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"},
                                                           {"ge", ">="}, {">=", ">="}};
    auto it = cmp.find(name);
    if (it != cmp.end()) return truthy(binary(it->second, v, need_arg(), p));
    fail(p, "unsupported construct: test '" + name + "'");
  }

  // The `attribute` of filters (map, selectattr, join, sort...): dotted path, each step getitem.
  Value attribute_of(const Value& v, const std::string& path, Pos p) {
    Value cur = v;
    size_t i = 0;
    while (i <= path.size()) {
      const size_t j = std::min(path.find('.', i), path.size());
      const std::string part = path.substr(i, j - i);
      if (cur.is_undefined()) return cur;
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        cur = get_item(cur, Value::integer(std::strtoll(part.c_str(), nullptr, 10)), p);
      else
        cur = get_item(cur, Value::string(part), p);
      i = j + 1;
    }
    return cur;
  }

  Value filter(const std::string& name, Value v, const Args& a, Pos p) {
    const Value* a0 = a.pos.empty() ? nullptr : &a.pos[0];
    auto kw = [&](size_t i, const char* k) { return a.get(i, k); };
    auto str_of = [&](const Value& x) { return to_str(x); };
    if (name == "default" || name == "d") {
      const Value* dflt = kw(0, "default_value");
      const Value* boolean = kw(1, "boolean");
      const bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (dflt ? *dflt : Value::string("")) : v;
    }
    if (name == "safe") return v;
    if (name == "string") return Value::string(str_of(v));
    if (name == "tojson") {
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      // over json.dumps.
      if (v.is_undefined()) fail(p, "tojson: Object of type Undefined is not JSON serializable");
      JsonStyle st;
      if (const Value* ea = kw(0, "ensure_ascii")) st.ensure_ascii = truthy(*ea);
      if (const Value* ind = kw(1, "indent"); ind && ind->t != Value::T::None) {
        if (ind->t == Value::T::Int || ind->t == Value::T::Bool)
          st.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(ind->t == Value::T::Bool ? ind->b : ind->i, 0, 64)), ' ');
        else if (ind->t == Value::T::String) st.indent = ind->s;
        else fail(p, "tojson: indent must be an integer or a string, got " + type_name(*ind));
        st.item_sep = ",";
      }
      if (const Value* sep = kw(2, "separators"); sep && sep->t != Value::T::None) {
        if (sep->t != Value::T::List || sep->list->size() != 2 || (*sep->list)[0].t != Value::T::String ||
            (*sep->list)[1].t != Value::T::String)
          fail(p, "tojson: separators must be a pair of strings");
        st.item_sep = (*sep->list)[0].s;
        st.key_sep = (*sep->list)[1].s;
      }
      if (const Value* sk = kw(3, "sort_keys")) st.sort_keys = truthy(*sk);
      std::string out;
      to_json(v, st, 0, out, p);
      return Value::string(std::move(out));
    }
    if (name == "length" || name == "count") {
      switch (v.t) {
        case Value::T::Undefined: return Value::integer(0);
        case Value::T::String: return Value::integer(static_cast<int64_t>(utf8_length(v.s)));
        case Value::T::List: return Value::integer(static_cast<int64_t>(v.list->size()));
        case Value::T::Dict: return Value::integer(static_cast<int64_t>(v.dict->size()));
        default: fail(p, "object of type '" + type_name(v) + "' has no len()");
      }
    }
    if (name == "trim") {
      const Value* chars = kw(0, "chars");
      const std::string s = str_of(v);
      if (chars && chars->t == Value::T::String) return Value::string(strip_chars(s, chars->s, true, true));
      return Value::string(py_strip(s, true, true));
    }
    if (name == "upper") return Value::string(ascii_upper(str_of(v)));
    if (name == "lower") return Value::string(ascii_lower(str_of(v)));
    if (name == "capitalize") return Value::string(py_capitalize(str_of(v)));
    if (name == "title") return Value::string(jinja_title(str_of(v)));
    if (name == "replace") {
      const Value* from = kw(0, "old");
      const Value* to = kw(1, "new");
      const Value* count = kw(2, "count");
      if (!from || !to) fail(p, "replace filter needs old and new");
      return checked(Value::string(replace_all(str_of(v), str_of(*from), str_of(*to),
                                               count && count->t != Value::T::None ? as_int(*count, p, "count") : -1)),
                     p);
    }
    if (name == "format") {
      if (!a.kw.empty()) fail(p, "unsupported construct: format filter with keyword arguments");
      return Value::string(percent_format(str_of(v), a.pos, p));
    }
    if (name == "center") {
      const Value* width = kw(0, "width");
      const int64_t w = std::clamp<int64_t>(width ? as_int(*width, p, "width") : 80, 0, 4096);
      const std::string s = str_of(v);
      const auto n = static_cast<int64_t>(utf8_length(s));
      if (w <= n) return Value::string(s);
      const int64_t pad = w - n, left = pad / 2 + (pad & w & 1);  // CPython's str.center
      return Value::string(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
    }
    if (name == "wordcount") return Value::integer(static_cast<int64_t>(split(str_of(v), std::nullopt, -1, p).size()));
    if (name == "indent") {
      // jinja2's do_indent: every line but the first gets the indent (blank lines only with
      // blank=True), the first too with first=True.
      const Value* width = kw(0, "width");
      const Value* first = kw(1, "first");
      const Value* blank = kw(2, "blank");
      const std::string pad =
          width && width->t == Value::T::String
              ? width->s
              : std::string(static_cast<size_t>(std::clamp<int64_t>(width ? as_int(*width, p, "width") : 4, 0, 256)), ' ');
      const std::string s = str_of(v);
      std::vector<std::string> lines;
      for (size_t i = 0;;) {
        const size_t j = s.find('\n', i);
        if (j == std::string::npos) {
          if (i < s.size() || lines.empty()) lines.push_back(s.substr(i));
          break;
        }
        lines.push_back(s.substr(i, j - i));
        i = j + 1;
        if (i == s.size()) lines.push_back("");
      }
      // s + "\n" split by splitlines(): a trailing newline yields one empty last line.
      if (!s.empty() && s.back() == '\n') {
        // already has the empty line from above
      }
      std::string out = lines[0];
      for (size_t k = 1; k < lines.size(); ++k) {
        out += '\n';
        if (!lines[k].empty() || (blank && truthy(*blank))) out += pad;
        out += lines[k];
        check_size(out.size(), p);
      }
      if (first && truthy(*first)) out = pad + out;
      return Value::string(std::move(out));
    }
    if (name == "abs") {
      if (v.t == Value::T::Float) return Value::real(std::fabs(v.f));
      const int64_t x = as_int(v, p, "abs operand");
      if (x == INT64_MIN) fail(p, "integer overflow");
      return Value::integer(x < 0 ? -x : x);
    }
    if (name == "round") {
      if (!v.is_number()) fail(p, "round: expected a number, got " + type_name(v));
      const Value* prec = kw(0, "precision");
      const Value* method = kw(1, "method");
      const int64_t d = prec ? std::clamp<int64_t>(as_int(*prec, p, "precision"), -20, 20) : 0;
      const std::string m = method ? str_of(*method) : "common";
      const double scale = std::pow(10.0, static_cast<double>(d));
      const double x = as_float(v) * scale;
      double r;
      if (m == "common") r = std::nearbyint(x);  // Python's round(): halves to even
      else if (m == "ceil") r = std::ceil(x);
      else if (m == "floor") r = std::floor(x);
      else fail(p, "round: method must be common, ceil or floor");
      return Value::real(r / scale);
    }
    if (name == "int") {
      const Value* dflt = kw(0, "default");
      const Value fallback = dflt ? *dflt : Value::integer(0);
      if (v.t == Value::T::Int) return v;
      if (v.t == Value::T::Bool) return Value::integer(v.b);
      if (v.t == Value::T::Float) return std::isfinite(v.f) && std::fabs(v.f) < 9.2e18 ? Value::integer(static_cast<int64_t>(v.f)) : fallback;
      if (v.t == Value::T::String) {
        const std::string s = py_strip(v.s, true, true);
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == 0 && errno == 0) return Value::integer(x);
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == 0 && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
      }
      return fallback;
    }
    if (name == "float") {
      const Value* dflt = kw(0, "default");
      const Value fallback = dflt ? *dflt : Value::real(0.0);
      if (v.is_number()) return Value::real(as_float(v));
      if (v.t == Value::T::String) {
        const std::string s = py_strip(v.s, true, true);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == 0) return Value::real(d);
      }
      return fallback;
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::of_list({});
      if (v.t != Value::T::Dict) fail(p, "items filter: expected a mapping, got " + type_name(v));
      List l;
      for (const auto& [k, val] : *v.dict) l.push_back(Value::tuple({Value::string(k), val}));
      return Value::of_list(std::move(l));
    }
    if (v.is_undefined() && (name == "first" || name == "last"))
      return Value::undefined("No " + name + " item, sequence was empty.");
    List items = iterate(v, p);
    if (name == "list") return Value::of_list(std::move(items));
    if (name == "first" || name == "last") {
      if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.t == Value::T::String) {
        std::string out;
        for (auto it = items.rbegin(); it != items.rend(); ++it) out += it->s;
        return Value::string(std::move(out));
      }
      std::reverse(items.begin(), items.end());
      return Value::of_list(std::move(items));
    }
    if (name == "join") {
      const Value* sep = kw(0, "d");
      const Value* attr = kw(1, "attribute");
      std::string out;
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += sep ? str_of(*sep) : "";
        out += str_of(attr ? attribute_of(items[k], str_of(*attr), p) : items[k]);
        check_size(out.size(), p);
      }
      return Value::string(std::move(out));
    }
    if (name == "unique") {
      List out;
      for (auto& x : items)
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(std::move(x));
      return Value::of_list(std::move(out));
    }
    if (name == "sum") {
      const Value* attr = kw(0, "attribute");
      const Value* start = kw(1, "start");
      Value acc = start ? *start : Value::integer(0);
      for (const auto& x : items) acc = binary("+", acc, attr ? attribute_of(x, str_of(*attr), p) : x, p);
      return acc;
    }
    if (name == "min" || name == "max" || name == "sort") {
      const Value* attr = kw(name == "sort" ? 2 : 1, "attribute");
      const Value* rev = name == "sort" ? kw(0, "reverse") : nullptr;
      auto key = [&](const Value& x) { return attr ? attribute_of(x, str_of(*attr), p) : x; };
      auto less = [&](const Value& x, const Value& y) { return truthy(binary("<", key(x), key(y), p)); };
      if (name == "sort") {
        std::stable_sort(items.begin(), items.end(), less);
        if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
        return Value::of_list(std::move(items));
      }
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      Value best = items[0];
      for (size_t k = 1; k < items.size(); ++k)
        if (name == "min" ? less(items[k], best) : less(best, items[k])) best = items[k];
      return best;
    }
    if (name == "map") {
      List out;
      if (const Value* attr = kw(99, "attribute")) {
        const Value* dflt = kw(99, "default");
        for (const auto& x : items) {
          Value r = attribute_of(x, str_of(*attr), p);
          out.push_back(r.is_undefined() && dflt ? *dflt : r);
        }
        return Value::of_list(std::move(out));
      }
      if (!a0 || a0->t != Value::T::String) fail(p, "map filter needs a filter name or attribute=");
      Args rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      check_filter_name(a0->s, p);
      for (auto& x : items) out.push_back(filter(a0->s, std::move(x), rest, p));
      return Value::of_list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name.ends_with("attr");
      const bool keep_if = name.starts_with("select");
      size_t next = 0;
      std::string attr;
      if (by_attr) {
        if (!a0) fail(p, name + " filter needs an attribute name");
        attr = str_of(*a0);
        next = 1;
      }
      std::optional<std::string> test_name;
      if (next < a.pos.size()) test_name = str_of(a.pos[next]);
      Args targs;
      if (next + 1 < a.pos.size()) targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(next) + 1, a.pos.end());
      if (test_name) check_test_name(*test_name, p);
      List out;
      for (auto& x : items) {
        const Value subject = by_attr ? attribute_of(x, attr, p) : x;
        const bool r = test_name ? test(*test_name, subject, targs, p) : truthy(subject);
        if (r == keep_if) out.push_back(std::move(x));
      }
      return Value::of_list(std::move(out));
    }
    fail(p, "unsupported construct: filter '" + name + "'");
  }

  static void check_filter_name(const std::string& n, Pos p) {
    static const char* const ok[] = {"trim", "length", "count", "tojson", "upper", "lower", "default", "d", "first",
                                     "last", "join", "replace", "list", "string", "int", "float", "items",
                                     "capitalize", "title", "abs", "round", "safe", "unique", "reverse", "wordcount"};
    if (std::none_of(std::begin(ok), std::end(ok), [&](const char* x) { return n == x; }))
      fail(p, "unsupported construct: filter '" + n + "' (in map)");
  }
  static void check_test_name(const std::string& n, Pos p) {
    static const char* const ok[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float",
                                     "number", "string", "mapping", "iterable", "sequence", "callable", "odd", "even",
                                     "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le",
                                     "<=", "gt", "greaterthan", ">", "ge", ">=", "in", "sameas", "lower", "upper"};
    if (std::none_of(std::begin(ok), std::end(ok), [&](const char* x) { return n == x; }))
      fail(p, "unsupported construct: test '" + n + "'");
  }

  std::string& out_;
  std::vector<Frame> frames_;
  uint64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string render(const Program& program, const nlohmann::json& context) {
  std::string out;
  Renderer r(context, out);
  r.run(program.body);
  return out;
}

std::string render(const Program& program, const nlohmann::ordered_json& context) {
  std::string out;
  Renderer r(context, out);
  r.run(program.body);
  return out;
}

}  // namespace corelm::infer::jinja
