// parse_batch_line (declared in batch_api.h) on its own: it needs only the request parser, so
// the fuzz target (fuzz/batch_line_fuzz.cc) builds it without the queue or HTTP.
#include <nlohmann/json.hpp>

#include "batch_api.h"

namespace corelm::serve {
namespace {

using ojson = nlohmann::ordered_json;

// nlohmann's DOM nests its destructors and dumps recursively: a line of a million '[' would
// exhaust the stack. Real bodies nest a few levels (a json_schema a few dozen), so deeper is
// refused before parsing. Brackets inside strings do not count.
constexpr int kMaxLineNesting = 128;

bool nesting_within(std::string_view s, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

BatchLineError line_error(int64_t line_no, std::string code, std::string message, std::string param = "") {
  return BatchLineError{std::move(code), line_no, std::move(message), std::move(param)};
}

const char* type_of(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

}  // namespace

std::variant<queue::NewRequest, BatchLineError> parse_batch_line(std::string_view line, int64_t line_no,
                                                                 const std::string& endpoint,
                                                                 const std::vector<std::string>& model_ids,
                                                                 const RequestLimits& limits) {
  const std::string where = "line " + std::to_string(line_no) + ": ";
  if (!nesting_within(line, kMaxLineNesting))
    return line_error(line_no, "invalid_json",
                      where + "the line nests JSON deeper than " + std::to_string(kMaxLineNesting) + " levels");
  ojson j;
  try {
    j = ojson::parse(line.begin(), line.end());
  } catch (const ojson::exception& e) {
    // parse_error, and out_of_range for a number beyond double (1e999), found by the fuzzer.
    return line_error(line_no, "invalid_json", where + "not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object())
    return line_error(line_no, "invalid_json", where + "must be a JSON object, got " + type_of(j));

  auto cid = j.find("custom_id");
  if (cid == j.end() || cid->is_null())
    return line_error(line_no, "missing_required_parameter", where + "'custom_id' is required", "custom_id");
  if (!cid->is_string())
    return line_error(line_no, "invalid_custom_id", where + "'custom_id' must be a string, got " + type_of(*cid),
                      "custom_id");
  const std::string custom_id = cid->get<std::string>();
  if (custom_id.empty())
    return line_error(line_no, "invalid_custom_id", where + "'custom_id' must not be empty", "custom_id");
  if (custom_id.size() > 512)
    return line_error(line_no, "invalid_custom_id",
                      where + "'custom_id' is " + std::to_string(custom_id.size()) + " bytes, above the limit of 512",
                      "custom_id");

  auto method = j.find("method");
  if (method == j.end() || method->is_null())
    return line_error(line_no, "missing_required_parameter", where + "'method' is required", "method");
  if (!method->is_string() || method->get<std::string>() != "POST")
    return line_error(line_no, "invalid_method",
                      where + "'method' must be \"POST\", got " +
                          (method->is_string() ? "\"" + method->get<std::string>() + "\"" : std::string(type_of(*method))),
                      "method");

  auto url = j.find("url");
  if (url == j.end() || url->is_null())
    return line_error(line_no, "missing_required_parameter", where + "'url' is required", "url");
  if (!url->is_string())
    return line_error(line_no, "invalid_url", where + "'url' must be a string, got " + type_of(*url), "url");
  const std::string u = url->get<std::string>();
  Endpoint ep;
  if (u == "/v1/completions") ep = Endpoint::Completions;
  else if (u == "/v1/chat/completions") ep = Endpoint::ChatCompletions;
  else
    return line_error(line_no, "invalid_url",
                      where + "'url' \"" + u + "\" is not supported (use /v1/completions or /v1/chat/completions)",
                      "url");
  if (!endpoint.empty() && u != endpoint)
    return line_error(line_no, "invalid_url",
                      where + "'url' \"" + u + "\" does not match the batch's endpoint \"" + endpoint + "\"", "url");

  auto body = j.find("body");
  if (body == j.end() || body->is_null())
    return line_error(line_no, "missing_required_parameter", where + "'body' is required", "body");
  if (!body->is_object())
    return line_error(line_no, "invalid_request", where + "'body' must be a JSON object, got " + type_of(*body),
                      "body");
  if (auto s = body->find("stream"); s != body->end() && s->is_boolean() && s->get<bool>())
    return line_error(line_no, "invalid_request", where + "'body.stream' must not be true in a batch (results are files)",
                      "body.stream");

  // Compact and in the line's key order (json_schema properties are generated in that order);
  // equal bodies written with different spacing share one dedup key.
  std::string text = body->dump();
  ParseResult parsed = parse_request(ep, text, limits, model_ids);
  if (const auto* err = std::get_if<ApiError>(&parsed)) {
    std::string code = err->code.empty() ? "invalid_request" : err->code;
    std::string param = err->param.empty() ? "body" : "body." + err->param;
    return line_error(line_no, code, where + err->message, param);
  }
  queue::NewRequest r;
  r.model = std::get<ParsedRequest>(parsed).model;
  r.body = std::move(text);
  r.custom_id = custom_id;
  r.endpoint = u;
  return r;
}

}  // namespace corelm::serve
