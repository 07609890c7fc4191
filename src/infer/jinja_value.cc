// Python semantics of the template's values: str(), repr(), ==, truthiness, whitespace.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "infer/jinja_value.h"

#include "corelm/chat_template.h"

namespace corelm::infer::jinja {

const Value* Value::find(const std::string& key) const {
  const Dict* d = t == T::Dict ? dict.get() : t == T::Namespace ? ns.get() : nullptr;
  if (!d) return nullptr;
  for (const auto& [k, v] : *d)
    if (k == key) return &v;
  return nullptr;
}

namespace {
template <class J>
Value from_json_impl(const J& j, uint32_t depth = 0) {
  if (depth > kMaxValueDepth)
    throw TemplateError("chat template: the context nests lists/objects deeper than " + std::to_string(kMaxValueDepth) +
                        " levels");
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value::boolean(j.template get<bool>());
    case J::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value::integer(static_cast<int64_t>(u)) : Value::real(static_cast<double>(u));
    }
    case J::value_t::number_float: return Value::real(j.template get<double>());
    case J::value_t::string: return Value::string(j.template get<std::string>());
    case J::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json_impl(e, depth + 1));
      return Value::of_list(std::move(l));
    }
    case J::value_t::object: {
      Dict d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json_impl(it.value(), depth + 1));
      return Value::of_dict(std::move(d));
    }
    default: return Value::none();
  }
}
}  // namespace

Value from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

bool truthy(const Value& v) {
  switch (v.t) {
    case Value::T::Undefined:
    case Value::T::None: return false;
    case Value::T::Bool: return v.b;
    case Value::T::Int: return v.i != 0;
    case Value::T::Float: return v.f != 0.0;
    case Value::T::String: return !v.s.empty();
    case Value::T::List: return !v.list->empty();
    case Value::T::Dict: return !v.dict->empty();
    default: return true;
  }
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // The shortest %.*e that reads back as x: Python's repr digits.
  char buf[64];
  int prec = 0;
  for (; prec < 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::snprintf(buf, sizeof buf, "%.*e", prec, x);
  std::string s(buf);
  const size_t e = s.find('e');
  const int exp10 = std::atoi(s.c_str() + e + 1);
  std::string digits;
  bool neg = false;
  for (size_t k = 0; k < e; ++k) {
    if (s[k] == '-') neg = true;
    else if (std::isdigit(static_cast<unsigned char>(s[k]))) digits += s[k];
  }
  std::string out = neg ? "-" : "";
  if (exp10 >= -5 && exp10 < 16) {  // Python: fixed notation for 1e-5 <= |x| < 1e16... (repr rule: -4 <= exp < 16)
    if (exp10 < -4) {
      // falls through to the scientific form below
    } else if (exp10 < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
      return out;
    } else {
      const size_t int_digits = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_digits) {
        out += digits + std::string(int_digits - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
      }
      return out;
    }
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + ebuf;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + q;
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.t) {
    case Value::T::String: return repr_string(v.s);
    case Value::T::List: {
      std::string out = v.b ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      if (v.b && v.list->size() == 1) out += ",";
      return out + (v.b ? ")" : "]");
    }
    case Value::T::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, val] : *v.dict) {
        out += (first ? "" : ", ") + repr_string(key) + ": " + repr(val);
        first = false;
      }
      return out + "}";
    }
    case Value::T::Undefined: return "Undefined";
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.t) {
    case Value::T::Undefined: return "";
    case Value::T::None: return "None";
    case Value::T::Bool: return v.b ? "True" : "False";
    case Value::T::Int: return std::to_string(v.i);
    case Value::T::Float: return float_repr(v.f);
    case Value::T::String: return v.s;
    case Value::T::List:
    case Value::T::Dict: return repr(v);
    case Value::T::Namespace: return "<Namespace>";
    case Value::T::Callable: return "<function " + v.s + ">";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.t == Value::T::Float || b.t == Value::T::Float) {
      const double x = a.t == Value::T::Float ? a.f : static_cast<double>(a.t == Value::T::Bool ? a.b : a.i);
      const double y = b.t == Value::T::Float ? b.f : static_cast<double>(b.t == Value::T::Bool ? b.b : b.i);
      return x == y;
    }
    const int64_t x = a.t == Value::T::Bool ? a.b : a.i;
    const int64_t y = b.t == Value::T::Bool ? b.b : b.i;
    return x == y;
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::T::Undefined:
    case Value::T::None: return true;
    case Value::T::String: return a.s == b.s;
    case Value::T::List: {
      if (a.b != b.b || a.list->size() != b.list->size()) return false;  // (1, 2) != [1, 2]
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Value::T::Dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [key, val] : *a.dict) {
        const Value* o = b.find(key);
        if (!o || !equal(val, *o)) return false;
      }
      return true;
    }
    case Value::T::Namespace: return a.ns == b.ns;
    case Value::T::Callable: return a.s == b.s && a.self && b.self && equal(*a.self, *b.self);
    default: return false;
  }
}

std::string type_name(const Value& v) {
  switch (v.t) {
    case Value::T::Undefined: return "Undefined";
    case Value::T::None: return "NoneType";
    case Value::T::Bool: return "bool";
    case Value::T::Int: return "int";
    case Value::T::Float: return "float";
    case Value::T::String: return "str";
    case Value::T::List: return "list";
    case Value::T::Dict: return "dict";
    case Value::T::Namespace: return "Namespace";
    case Value::T::Callable: return "function";
  }
  return "?";
}

namespace {
// Length of the UTF-8 sequence starting at s[i] (1 for an invalid byte).
size_t seq_len(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}
}  // namespace

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += seq_len(s, i)) ++n;
  return n;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = seq_len(s, i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t space_at(const std::string& s, size_t i) {
  if (i >= s.size()) return 0;
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
  if (c < 0x80) return 0;
  auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (c == 0xC2 && (at(1) == 0x85 || at(1) == 0xA0)) return 2;                        // U+0085, U+00A0
  if (c == 0xE1 && at(1) == 0x9A && at(2) == 0x80) return 3;                          // U+1680
  if (c == 0xE2 && at(1) == 0x80 && ((at(2) >= 0x80 && at(2) <= 0x8A) || at(2) == 0xA8 || at(2) == 0xA9 || at(2) == 0xAF))
    return 3;                                                                         // U+2000..200A, 2028, 2029, 202F
  if (c == 0xE2 && at(1) == 0x81 && at(2) == 0x9F) return 3;                          // U+205F
  if (c == 0xE3 && at(1) == 0x80 && at(2) == 0x80) return 3;                          // U+3000
  return 0;
}

size_t space_before(const std::string& s, size_t end) {
  for (size_t n = 1; n <= 3 && n <= end; ++n)
    if (space_at(s, end - n) == n) return n;
  return 0;
}

std::string py_strip(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      const size_t w = space_at(s, b);
      if (!w) break;
      b += w;
    }
  if (right)
    while (e > b) {
      const size_t w = space_before(s, e);
      if (!w) break;
      e -= w;
    }
  return s.substr(b, e - b);
}

namespace {

uint32_t decode(const std::string& ch) {
  const auto c = static_cast<unsigned char>(ch[0]);
  if (ch.size() == 1) return c;
  uint32_t cp = c & (0x7F >> ch.size());
  for (size_t k = 1; k < ch.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
  return cp;
}

std::string encode(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// Upper-case partner of a lower-case code point (0 when none in the covered ranges).
uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c == 0xB5) return 0x39C;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    if (c == 0x130 || c == 0x138 || c == 0x149) return 0;
    const bool odd_lower = (c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
    if (odd_lower) return (c & 1) ? c - 1 : 0;
    return (c & 1) ? 0 : (c == 0x178 ? 0 : c - 1);  // 0x139..0x148 and 0x179..0x17E: even is lower
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x3AC && c <= 0x3AF) return c == 0x3AC ? 0x386 : c - 37;  // ά έ ή ί
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return 0;
}

uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 0;  // İ lowers to two code points in Python: left as is
    const bool even_upper = (c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
    if (even_upper) return (c & 1) ? 0 : c + 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : 0;
    return 0;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return 0;
}

}  // namespace

std::string py_upper(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const std::string& ch : utf8_chars(s)) {
    const uint32_t c = decode(ch);
    if (c == 0xDF) {
      out += "SS";
      continue;
    }
    const uint32_t u = to_upper(c);
    out += u ? encode(u) : ch;
  }
  return out;
}

std::string py_lower(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const std::string& ch : utf8_chars(s)) {
    const uint32_t l = to_lower(decode(ch));
    out += l ? encode(l) : ch;
  }
  return out;
}

bool py_cased(const std::string& ch) {
  const uint32_t c = decode(ch);
  return to_upper(c) != 0 || to_lower(c) != 0 || c == 0xDF;
}

}  // namespace corelm::infer::jinja
