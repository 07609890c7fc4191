// The values a chat template computes with, modelled on the Python objects jinja2 hands a
// template (None, bool, int, float, str, list, dict, namespace, jinja2's default Undefined) so
// that printing, truthiness, comparison and tojson give jinja2's bytes. Lists and dicts are
// immutable once built (transformers renders in an ImmutableSandboxedEnvironment); only a
// namespace() can be assigned to. Not a public contract: see include/corelm/chat_template.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace corelm::infer::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as a Python dict

struct Value {
  enum class T : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };
  T t = T::Undefined;
  bool b = false;
  uint32_t depth = 0;  // nesting of lists / dicts inside this value (0 for scalars)
  int64_t i = 0;
  double f = 0;
  // String: the UTF-8 text. Undefined: what jinja2 would say when it is used ("'x' is undefined").
  // Callable: the function's name ("raise_exception", "str.strip", "dict.items", "loop.cycle").
  std::string s;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Dict> ns;             // Namespace: shared and mutable (`set ns.x = ...`)
  std::shared_ptr<const Value> self;    // Callable: the bound object of a method

  static Value undefined(std::string hint) { Value v; v.s = std::move(hint); return v; }
  static Value none() { Value v; v.t = T::None; return v; }
  static Value boolean(bool x) { Value v; v.t = T::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.t = T::Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.t = T::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.t = T::String; v.s = std::move(x); return v; }
  static Value of_list(List x) {
    Value v;
    v.t = T::List;
    for (const auto& e : x) v.depth = std::max(v.depth, e.depth + 1);
    v.list = std::make_shared<const List>(std::move(x));
    return v;
  }
  // A Python tuple: a List whose `b` is set, printed as (a, b) (dict.items() pairs, `(1, 2)`).
  static Value tuple(List x) { Value v = of_list(std::move(x)); v.b = true; return v; }
  static Value of_dict(Dict x) {
    Value v;
    v.t = T::Dict;
    for (const auto& e : x) v.depth = std::max(v.depth, e.second.depth + 1);
    v.dict = std::make_shared<const Dict>(std::move(x));
    return v;
  }
  static Value callable(std::string name) { return callable(std::move(name), Value()); }
  static Value callable(std::string name, Value self) {
    Value v;
    v.t = T::Callable;
    v.s = std::move(name);
    v.self = std::make_shared<const Value>(std::move(self));
    return v;
  }

  bool is_undefined() const { return t == T::Undefined; }
  bool is_number() const { return t == T::Int || t == T::Float || t == T::Bool; }
  // A Python dict lookup; nullptr when absent.
  const Value* find(const std::string& key) const;
};

// How deep lists and dicts may nest, in the context and in what a template stores (`set`): keeps
// printing, comparing and tojson (recursive) within the stack.
constexpr uint32_t kMaxValueDepth = 256;

// TemplateError when the JSON nests deeper than kMaxValueDepth.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);  // keeps the key order, as Python's json.loads
bool truthy(const Value& v);
// str(v) as Python prints it ({{ v }}): None -> "None", True -> "True", 1.0 -> "1.0", lists and
// dicts as their repr; Undefined -> "".
std::string to_str(const Value& v);
std::string repr(const Value& v);
// Python's repr of a float (shortest round-trip digits; "1e+16", "1.5e-05", "inf", "nan").
std::string float_repr(double x);
// Python ==, as jinja2 compares (1 == 1.0 == True; Undefined equals only Undefined).
bool equal(const Value& a, const Value& b);
// The name of the Python type, for error messages ("str", "int", "list", "dict", "NoneType").
std::string type_name(const Value& v);
// Length in Unicode code points (Python len() of a str); invalid UTF-8 bytes count one each.
size_t utf8_length(const std::string& s);
// The code points of a string, each as its UTF-8 bytes (an invalid byte stands alone).
std::vector<std::string> utf8_chars(const std::string& s);

// Python's whitespace (str.isspace / \\s): the byte length of the whitespace character that
// starts at s[i] (ends at s[end] for space_before), 0 when there is none.
size_t space_at(const std::string& s, size_t i);
size_t space_before(const std::string& s, size_t end);
std::string py_strip(const std::string& s, bool left, bool right);
// Python's str.upper() / str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
// (and ß -> SS); other scripts are left unchanged. Invalid UTF-8 bytes pass through.
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
// Python's str.isalpha / cased test for one UTF-8 character under the same coverage.
bool py_cased(const std::string& ch);

}  // namespace corelm::infer::jinja
