// The JSON Schema subset compiled to a regular expression for the byte-level NFA (regex_nfa.h).
// Every construct of the subset is bounded, so a regular language suffices: objects list their
// properties (schema key order; optional ones may be skipped, no others are ever emitted),
// arrays repeat their item pattern, and a value the schema leaves free (`{}`, an object without
// properties, an array without items) is any JSON value nested at most kFreeDepth levels.
// Whitespace: one run of at most 16 bytes wherever JSON allows it, none around the whole value.
#include <cctype>
#include <set>
#include <string>

#include "corelm/error.h"
#include "infer/constraint_impl.h"

namespace corelm::infer::constraint {
namespace {

constexpr int kMaxSchemaDepth = 32;
constexpr int kFreeDepth = 3;
constexpr int64_t kMaxCount = 1000;  // minItems / maxItems / minLength / maxLength
constexpr size_t kMaxPattern = size_t{8} << 20;

std::string byte(int b) { return std::string(1, static_cast<char>(b)); }

// A literal byte string as a pattern.
std::string lit(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c >= 0x80) {
      out += static_cast<char>(c);
    } else {
      out += '\\';
      out += static_cast<char>(c);
    }
  }
  return out;
}

const std::string kWs = "[ \\t\\n\\r]{0,16}";
const std::string kHex = "[0-9a-fA-F]";

// One code point of a JSON string body: an unescaped ASCII character, an escape (surrogates only
// as a high/low pair), or a well-formed UTF-8 sequence.
std::string string_char() {
  const std::string c80bf = "[" + byte(0x80) + "-" + byte(0xBF) + "]";
  std::string ascii = "[^\"\\\\" + byte(0x00) + "-" + byte(0x1F) + byte(0x80) + "-" + byte(0xFF) + "]";
  std::string esc = "\\\\([\"\\\\/bfnrt]|u([0-9a-cA-Ce-fE-F]" + kHex + "{3}|[dD][0-7]" + kHex + "{2}|[dD][89abAB]" + kHex +
                    "{2}\\\\u[dD][c-fC-F]" + kHex + "{2}))";
  std::string utf8 = "[" + byte(0xC2) + "-" + byte(0xDF) + "]" + c80bf;
  utf8 += "|" + byte(0xE0) + "[" + byte(0xA0) + "-" + byte(0xBF) + "]" + c80bf;
  utf8 += "|[" + byte(0xE1) + "-" + byte(0xEC) + byte(0xEE) + byte(0xEF) + "]" + c80bf + "{2}";
  utf8 += "|" + byte(0xED) + "[" + byte(0x80) + "-" + byte(0x9F) + "]" + c80bf;
  utf8 += "|" + byte(0xF0) + "[" + byte(0x90) + "-" + byte(0xBF) + "]" + c80bf + "{2}";
  utf8 += "|[" + byte(0xF1) + "-" + byte(0xF3) + "]" + c80bf + "{3}";
  utf8 += "|" + byte(0xF4) + "[" + byte(0x80) + "-" + byte(0x8F) + "]" + c80bf + "{2}";
  return "(" + ascii + "|" + esc + "|" + utf8 + ")";
}

std::string repeat(int64_t lo, int64_t hi) {  // hi < 0: unbounded
  if (hi < 0) return lo == 0 ? "*" : "{" + std::to_string(lo) + ",}";
  return "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

const std::string& json_string_any() {
  static const std::string s = "\"" + string_char() + "*\"";
  return s;
}
// At most 18 integer and 2 exponent digits (as json_object): every number fits a double and every
// integer an int64, so strict parsers never report overflow.
const std::string kNumber = "-?(0|[1-9][0-9]{0,17})(\\.[0-9]+)?([eE][+\\-]?[0-9]{1,2})?";
const std::string kInteger = "-?(0|[1-9][0-9]{0,17})";

// Any JSON value nested at most `depth` levels (0: scalars only).
std::string any_value(int depth) {
  std::string scalar = json_string_any() + "|" + kNumber + "|true|false|null";
  if (depth <= 0) return "(" + scalar + ")";
  const std::string inner = any_value(depth - 1);
  const std::string member = json_string_any() + kWs + ":" + kWs + inner;
  const std::string arr = "\\[" + kWs + "(" + inner + "(" + kWs + "," + kWs + inner + ")*)?" + kWs + "\\]";
  const std::string obj = "\\{" + kWs + "(" + member + "(" + kWs + "," + kWs + member + ")*)?" + kWs + "\\}";
  return "(" + scalar + "|" + arr + "|" + obj + ")";
}
const std::string& free_value() {
  static const std::string s = any_value(kFreeDepth);
  return s;
}

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title",      "description", "default",    "examples", "$schema", "$id",
                                          "$comment",   "deprecated",  "readOnly",   "writeOnly"};
  return s;
}
const std::set<std::string>& supported() {
  static const std::set<std::string> s = {"type",     "properties", "required",  "items",     "minItems",
                                          "maxItems", "enum",       "const",     "anyOf",     "minLength",
                                          "maxLength", "additionalProperties"};
  return s;
}

std::string child(const std::string& path, const std::string& key) {
  std::string k;
  for (char c : key) k += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
  return path + "/" + k;
}

template <class J>
std::string dump(const J& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

template <class J>
class SchemaCompiler {
 public:
  std::string compile(const J& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) fail(path, "schemas nested deeper than " + std::to_string(kMaxSchemaDepth));
    if (s.is_boolean()) {
      if (!s.template get<bool>()) fail(path, "the schema false matches nothing");
      return free_value();
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!supported().count(it.key()) && !annotations().count(it.key()))
        fail(path, "unsupported keyword '" + it.key() + "'");
    std::string out;
    if (s.contains("anyOf")) {
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != "anyOf" && !annotations().count(it.key()))
          fail(path, "keyword '" + it.key() + "' beside anyOf is not supported");
      const J& alts = s["anyOf"];
      if (!alts.is_array() || alts.empty()) fail(child(path, "anyOf"), "anyOf must be a non-empty array");
      for (size_t i = 0; i < alts.size(); ++i)
        out += (i ? "|" : "") + compile(alts[i], child(child(path, "anyOf"), std::to_string(i)), depth + 1);
      out = "(" + out + ")";
    } else if (s.contains("const")) {
      out = "(" + lit(dump(s["const"])) + ")";
    } else if (s.contains("enum")) {
      const J& vals = s["enum"];
      if (!vals.is_array() || vals.empty()) fail(child(path, "enum"), "enum must be a non-empty array");
      const std::vector<std::string> types = type_list(s, path);
      for (const auto& v : vals) {
        if (!types.empty() && !type_matches(v, types)) continue;
        out += (out.empty() ? "" : "|") + lit(dump(v));
      }
      if (out.empty()) fail(child(path, "enum"), "no enum value has the schema's type");
      out = "(" + out + ")";
    } else {
      std::vector<std::string> types = type_list(s, path);
      if (types.empty()) {
        if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) types = {"object"};
        else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) types = {"array"};
        else if (s.contains("minLength") || s.contains("maxLength")) types = {"string"};
      }
      if (types.empty()) return free_value();
      for (size_t i = 0; i < types.size(); ++i) out += (i ? "|" : "") + typed(s, types[i], path, depth);
      out = "(" + out + ")";
    }
    if (out.size() > kMaxPattern) fail(path, "schema too large (its pattern exceeds 8 MiB)");
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& why) {
    throw ValueError("json_schema: " + why + " at #" + path);
  }

  static std::vector<std::string> type_list(const J& s, const std::string& path) {
    std::vector<std::string> types;
    if (!s.contains("type")) return types;
    const J& t = s["type"];
    static const std::set<std::string> known = {"object", "array", "string", "number", "integer", "boolean", "null"};
    auto add = [&](const J& v) {
      if (!v.is_string() || !known.count(v.template get<std::string>()))
        fail(child(path, "type"), "unsupported type " + v.dump());
      types.push_back(v.template get<std::string>());
    };
    if (t.is_array()) {
      if (t.empty()) fail(child(path, "type"), "type must not be an empty array");
      for (const auto& v : t) add(v);
    } else {
      add(t);
    }
    return types;
  }
  static bool type_matches(const J& v, const std::vector<std::string>& types) {
    for (const auto& t : types) {
      if ((t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "string" && v.is_string()) ||
          (t == "number" && v.is_number()) || (t == "integer" && v.is_number_integer()) ||
          (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()))
        return true;
    }
    return false;
  }
  static int64_t count(const J& s, const char* key, const std::string& path, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const J& v = s[key];
    if (!v.is_number_integer() || v.template get<int64_t>() < 0 || v.template get<int64_t>() > kMaxCount)
      fail(child(path, key), std::string(key) + " must be an integer in [0, " + std::to_string(kMaxCount) + "]");
    return v.template get<int64_t>();
  }

  std::string typed(const J& s, const std::string& type, const std::string& path, int depth) {
    if (type == "string") {
      const int64_t lo = count(s, "minLength", path, 0), hi = count(s, "maxLength", path, -1);
      if (hi >= 0 && hi < lo) fail(path, "maxLength below minLength");
      if (lo == 0 && hi < 0) return json_string_any();
      return "\"" + string_char() + repeat(lo, hi) + "\"";
    }
    if (type == "number") return kNumber;
    if (type == "integer") return kInteger;
    if (type == "boolean") return "(true|false)";
    if (type == "null") return "null";
    if (type == "array") {
      const int64_t lo = count(s, "minItems", path, 0), hi = count(s, "maxItems", path, -1);
      if (hi >= 0 && hi < lo) fail(path, "maxItems below minItems");
      std::string item = s.contains("items") ? compile(s["items"], child(path, "items"), depth + 1) : free_value();
      if (hi == 0) return "\\[" + kWs + "\\]";
      std::string body = item + "(" + kWs + "," + kWs + item + ")" + repeat(lo == 0 ? 0 : lo - 1, hi < 0 ? -1 : hi - 1);
      if (lo == 0) body = "(" + body + ")?";
      return "\\[" + kWs + body + kWs + "\\]";
    }
    // object
    const bool closed = s.contains("additionalProperties") && s["additionalProperties"].is_boolean() &&
                        !s["additionalProperties"].template get<bool>();
    if (!s.contains("properties")) {
      if (s.contains("required") && s["required"].is_array() && !s["required"].empty())
        fail(child(path, "required"), "required names properties the schema does not list");
      if (closed) return "\\{" + kWs + "\\}";
      const std::string member = json_string_any() + kWs + ":" + kWs + any_value(kFreeDepth - 1);
      return "\\{" + kWs + "(" + member + "(" + kWs + "," + kWs + member + ")*)?" + kWs + "\\}";
    }
    const J& props = s["properties"];
    if (!props.is_object()) fail(child(path, "properties"), "properties must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      const J& r = s["required"];
      if (!r.is_array()) fail(child(path, "required"), "required must be an array of names");
      for (const auto& n : r) {
        if (!n.is_string()) fail(child(path, "required"), "required must be an array of names");
        if (!props.contains(n.template get<std::string>()))
          fail(child(path, "required"), "required property '" + n.template get<std::string>() + "' is not in properties");
        required.insert(n.template get<std::string>());
      }
    }
    std::vector<std::string> members;
    std::vector<bool> req;
    for (auto it = props.begin(); it != props.end(); ++it) {
      const std::string value = compile(it.value(), child(child(path, "properties"), it.key()), depth + 1);
      members.push_back(lit(dump(J(it.key()))) + kWs + ":" + kWs + value);
      req.push_back(required.count(it.key()) > 0);
      if (members.back().size() > kMaxPattern) fail(path, "schema too large (its pattern exceeds 8 MiB)");
    }
    const std::string sep = kWs + "," + kWs;
    size_t first_req = members.size();
    for (size_t i = 0; i < members.size(); ++i)
      if (req[i]) {
        first_req = i;
        break;
      }
    std::string body;
    auto tail_after = [&](size_t from) {
      std::string t;
      for (size_t k = from; k < members.size(); ++k) t += req[k] ? sep + members[k] : "(" + sep + members[k] + ")?";
      if (t.size() > kMaxPattern) fail(path, "schema too large (its pattern exceeds 8 MiB)");
      return t;
    };
    if (first_req < members.size()) {
      // Optional properties before the first required one each carry their own comma.
      for (size_t i = 0; i < first_req; ++i) body += "(" + members[i] + sep + ")?";
      body += members[first_req] + tail_after(first_req + 1);
    } else if (!members.empty()) {
      // All optional: the first present property starts the list (quadratic in the count).
      std::string alts;
      for (size_t j = 0; j < members.size(); ++j) {
        alts += (j ? "|" : "") + members[j] + tail_after(j + 1);
        if (alts.size() > kMaxPattern) fail(path, "schema too large (its pattern exceeds 8 MiB)");
      }
      body = "(" + alts + ")?";
    }
    return "\\{" + kWs + body + kWs + "\\}";
  }
};

}  // namespace

std::string schema_to_regex(const nlohmann::json& schema) { return SchemaCompiler<nlohmann::json>().compile(schema, "", 0); }
std::string schema_to_regex(const nlohmann::ordered_json& schema) {
  return SchemaCompiler<nlohmann::ordered_json>().compile(schema, "", 0);
}

}  // namespace corelm::infer::constraint
