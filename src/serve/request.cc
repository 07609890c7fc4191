#include "serve/request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "corelm/utf8.h"

namespace corelm::serve {

ApiError api_error(int status, std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  if (status >= 500) e.type = "server_error";
  if (status == 401) e.type = "authentication_error";
  if (status == 429) e.type = "rate_limit_error";
  return e;
}

nlohmann::json ApiError::to_json() const {
  nlohmann::json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return {{"error", e}};
}

namespace {

using json = nlohmann::json;

// Thrown inside the parser only; parse_request turns it into its ApiError result.
struct Reject {
  ApiError error;
};

[[noreturn]] void reject(const std::string& param, const std::string& message, int status = 400,
                         const std::string& code = "") {
  throw Reject{api_error(status, message, param, code)};
}

// Runs one body parser: a Reject is its result, and so is any other exception (a type the checks
// missed), as a 400: never a crash.
template <class Parsed, class Parse>
std::variant<Parsed, ApiError> guarded(Parse parse) {
  try {
    return parse();
  } catch (Reject& e) {
    return std::move(e.error);
  } catch (const std::exception& e) {
    return api_error(400, std::string("invalid request: ") + e.what());
  }
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* want, const json& v) {
  reject(param, "'" + param + "' must be " + want + " (got " + type_name(v) + ")", 400, "invalid_type");
}

// The JSON parser rejects invalid UTF-8 in the body; strings still get this check so a message
// always names the field (and so a future lenient parser cannot let bad bytes through).
std::string get_string(const json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  const std::string& s = v.get_ref<const std::string&>();
  if (!valid_utf8(s)) reject(param, "'" + param + "' is not valid UTF-8");
  return s;
}

bool get_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

double get_number(const json& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    reject(param, "'" + param + "' must be in [" + json(lo).dump() + ", " + json(hi).dump() + "] (got " + v.dump() + ")");
  return d;
}

// Integers only: 2.0 is accepted (JSON has one number type), 2.5 is not.
int64_t get_int(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (!v.is_number()) wrong_type(param, "an integer", v);
  int64_t x = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      reject(param, "'" + param + "' must be at most " + std::to_string(hi) + " (got " + v.dump() + ")");
    x = v.get<int64_t>();
  } else {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15)
      reject(param, "'" + param + "' must be an integer (got " + v.dump() + ")", 400, "invalid_type");
    x = static_cast<int64_t>(d);
  }
  if (x < lo || x > hi)
    reject(param, "'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " +
                      std::to_string(x) + ")");
  return x;
}

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;  // null means "not given", as OpenAI treats it
  return &*it;
}

std::vector<TokenId> get_ids(const json& v, const std::string& param) {
  std::vector<TokenId> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(static_cast<TokenId>(get_int(v[i], param + "[" + std::to_string(i) + "]", 0,
                                               std::numeric_limits<TokenId>::max())));
  return ids;
}

std::string resolve_model(const json& body, const std::vector<std::string>& models) {
  const json* m = field(body, "model");
  if (!m) {
    if (models.size() == 1) return models.front();
    reject("model", "'model' is required (this server serves " + std::to_string(models.size()) +
                        " models; GET /v1/models lists them)");
  }
  std::string id = get_string(*m, "model");
  if (std::find(models.begin(), models.end(), id) == models.end())
    reject("model", "The model '" + id + "' does not exist (GET /v1/models lists the served models)", 404,
           "model_not_found");
  return id;
}

json parse_object(std::string_view body) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("utf-8") != std::string::npos ||
        what.find("surrogate") != std::string::npos)
      reject("", "the request body is not valid UTF-8 JSON: " + what);
    reject("", "the request body is not valid JSON: " + what);
  }
  if (!j.is_object()) reject("", std::string("the request body must be a JSON object (got ") + type_name(j) + ")");
  return j;
}

// ordered_json looks keys up by a linear scan, so parsing an object of n members in order costs
// n^2 compares: bound n before the schema is parsed again in order (~0.3 s for a 4 MiB body of
// such objects). The nesting is bounded too, since copying or printing a json value recurses
// (the compiler itself rejects schemas nested deeper than 32 levels). The walk is iterative: the
// body's nesting is unbounded here.
constexpr size_t kMaxSchemaObjectMembers = 512;
constexpr int kMaxSchemaNesting = 64;

void check_schema_objects(const json& schema) {
  std::vector<std::pair<const json*, int>> todo{{&schema, 1}};
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    if (v->is_object() && v->size() > kMaxSchemaObjectMembers)
      reject("response_format", "'response_format.json_schema.schema' holds an object of " + std::to_string(v->size()) +
                                    " members, above the limit of " + std::to_string(kMaxSchemaObjectMembers));
    if (!v->is_structured()) continue;
    if (depth > kMaxSchemaNesting)
      reject("response_format", "'response_format.json_schema.schema' is nested deeper than " +
                                    std::to_string(kMaxSchemaNesting) + " levels");
    for (const auto& c : *v) todo.emplace_back(&c, depth + 1);
  }
}

// response_format.json_schema.schema with its keys in body order (nlohmann::json sorts them):
// the body parsed again, every other member discarded while parsing. Runs after parse_common
// has validated that path.
nlohmann::ordered_json ordered_schema(std::string_view body) {
  using ojson = nlohmann::ordered_json;
  static const char* const path[] = {"response_format", "json_schema", "schema"};
  ojson b = ojson::parse(body.begin(), body.end(), [](int depth, ojson::parse_event_t ev, ojson& parsed) {
    if (ev == ojson::parse_event_t::key && depth >= 1 && depth <= 3)
      return parsed.get_ref<const std::string&>() == path[depth - 1];
    return true;
  });
  return std::move(b[path[0]][path[1]][path[2]]);
}

void parse_common(const json& b, const RequestLimits& limits, ParsedRequest& r) {
  if (const json* v = field(b, "max_completion_tokens")) r.max_tokens = get_int(*v, "max_completion_tokens", 1, limits.max_tokens_limit);
  else if (const json* v = field(b, "max_tokens")) r.max_tokens = get_int(*v, "max_tokens", 1, limits.max_tokens_limit);
  if (const json* v = field(b, "temperature")) r.temperature = static_cast<float>(get_number(*v, "temperature", 0, 2));
  if (const json* v = field(b, "top_p")) {
    r.top_p = static_cast<float>(get_number(*v, "top_p", 0, 1));
    if (r.top_p <= 0) reject("top_p", "'top_p' must be in (0, 1] (got " + v->dump() + ")");
  }
  if (const json* v = field(b, "seed")) {
    // OpenAI takes any 64-bit integer; the scheduler's seed is the bit pattern.
    if (v->is_number_unsigned()) r.seed = v->get<uint64_t>();
    else r.seed = static_cast<uint64_t>(get_int(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    r.seed_given = true;
  }
  if (const json* v = field(b, "n")) r.n = static_cast<int>(get_int(*v, "n", 1, limits.max_n));
  if (const json* v = field(b, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(get_string(*v, "stop"));
    } else if (v->is_array()) {
      if (static_cast<int64_t>(v->size()) > limits.max_stop)
        reject("stop", "'stop' may hold at most " + std::to_string(limits.max_stop) + " strings (got " +
                           std::to_string(v->size()) + ")");
      for (size_t i = 0; i < v->size(); ++i) r.stop.push_back(get_string((*v)[i], "stop[" + std::to_string(i) + "]"));
    } else {
      wrong_type("stop", "a string or an array of strings", *v);
    }
    for (const auto& s : r.stop)
      if (s.empty()) reject("stop", "'stop' strings must not be empty");
  }
  if (const json* v = field(b, "stream")) r.stream = get_bool(*v, "stream");
  if (const json* v = field(b, "stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (const json* u = field(*v, "include_usage")) r.include_usage = get_bool(*u, "stream_options.include_usage");
  }
  if (const json* v = field(b, "presence_penalty")) r.presence_penalty = static_cast<float>(get_number(*v, "presence_penalty", -2, 2));
  if (const json* v = field(b, "frequency_penalty")) r.frequency_penalty = static_cast<float>(get_number(*v, "frequency_penalty", -2, 2));
  if (const json* v = field(b, "logit_bias")) {
    if (!v->is_object()) wrong_type("logit_bias", "an object mapping token ids to biases", *v);
    if (static_cast<int64_t>(v->size()) > limits.max_logit_bias)
      reject("logit_bias", "'logit_bias' may hold at most " + std::to_string(limits.max_logit_bias) + " entries");
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string& key = it.key();
      const std::string p = "logit_bias[" + key + "]";
      if (key.empty() || key.size() > 10 || !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
        reject("logit_bias", "'logit_bias' keys must be token ids (decimal integers; got '" +
                                 (valid_utf8(key) ? key : escape_invalid_utf8(key)) + "')");
      const long long id = std::stoll(key);
      if (id > std::numeric_limits<TokenId>::max()) reject("logit_bias", "'logit_bias' key " + key + " is not a token id");
      r.logit_bias.emplace_back(static_cast<TokenId>(id), static_cast<float>(get_number(it.value(), p, -100, 100)));
    }
  }
  if (const json* v = field(b, "user")) r.user = get_string(*v, "user");
  if (const json* v = field(b, "response_format")) {
    if (!v->is_object()) wrong_type("response_format", "an object", *v);
    const json* t = field(*v, "type");
    if (!t) reject("response_format", "'response_format.type' is required");
    const std::string type = get_string(*t, "response_format.type");
    if (type == "text") {
      r.format = OutputFormat::Text;
    } else if (type == "json_object") {
      r.format = OutputFormat::JsonObject;
    } else if (type == "json_schema") {
      const json* js = field(*v, "json_schema");
      if (!js) reject("response_format", "'response_format.json_schema' is required for type json_schema");
      if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
      if (const json* nm = field(*js, "name")) get_string(*nm, "response_format.json_schema.name");
      if (const json* st = field(*js, "strict")) get_bool(*st, "response_format.json_schema.strict");
      const json* schema = field(*js, "schema");
      if (!schema) reject("response_format", "'response_format.json_schema.schema' is required");
      if (!schema->is_object() && !schema->is_boolean())
        wrong_type("response_format.json_schema.schema", "an object", *schema);
      check_schema_objects(*schema);
      r.format = OutputFormat::JsonSchema;
    } else {
      reject("response_format", "'response_format.type' must be 'text', 'json_object' or 'json_schema' (got '" + type + "')");
    }
  }
  // corelm extensions: one grammar per request.
  if (const json* v = field(b, "regex")) {
    if (r.format != OutputFormat::Text) reject("regex", "give at most one of 'response_format', 'regex' and 'choices'");
    r.regex = get_string(*v, "regex");
    if (r.regex.empty()) reject("regex", "'regex' must not be empty");
    r.format = OutputFormat::Regex;
  }
  if (const json* v = field(b, "choices")) {
    if (r.format != OutputFormat::Text) reject("choices", "give at most one of 'response_format', 'regex' and 'choices'");
    if (!v->is_array()) wrong_type("choices", "an array of strings", *v);
    if (v->empty() || static_cast<int64_t>(v->size()) > limits.max_choices)
      reject("choices", "'choices' must hold 1 to " + std::to_string(limits.max_choices) + " strings");
    for (size_t i = 0; i < v->size(); ++i) r.choices.push_back(get_string((*v)[i], "choices[" + std::to_string(i) + "]"));
    r.format = OutputFormat::Choices;
  }
}

void parse_completions(const json& b, const RequestLimits& limits, ParsedRequest& r) {
  const json* p = field(b, "prompt");
  if (!p) reject("prompt", "'prompt' is required");
  if (p->is_string()) {
    r.prompts.push_back({get_string(*p, "prompt"), {}, false});
  } else if (p->is_array()) {
    if (p->empty()) reject("prompt", "'prompt' must not be an empty array");
    const bool ids = (*p)[0].is_number();
    if (ids) {
      r.prompts.push_back({"", get_ids(*p, "prompt"), true});
    } else {
      if (static_cast<int64_t>(p->size()) > limits.max_prompts)
        reject("prompt", "'prompt' may list at most " + std::to_string(limits.max_prompts) + " prompts (got " +
                             std::to_string(p->size()) + ")");
      for (size_t i = 0; i < p->size(); ++i) {
        const json& e = (*p)[i];
        const std::string name = "prompt[" + std::to_string(i) + "]";
        if (e.is_string()) r.prompts.push_back({get_string(e, name), {}, false});
        else if (e.is_array()) r.prompts.push_back({"", get_ids(e, name), true});
        else wrong_type(name, "a string or an array of token ids", e);
      }
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or an array of token ids", *p);
  }
  if (const json* v = field(b, "logprobs")) r.top_logprobs = static_cast<int>(get_int(*v, "logprobs", 0, 5));
  if (const json* v = field(b, "echo")) r.echo = get_bool(*v, "echo");
  if (r.echo) reject("echo", "'echo' is not supported");
  if (const json* v = field(b, "best_of"))
    if (get_int(*v, "best_of", 1, limits.max_n) != r.n) reject("best_of", "'best_of' other than n is not supported");
  if (static_cast<int64_t>(r.prompts.size()) * r.n > 128)
    reject("n", "prompts x n must be at most 128 (got " + std::to_string(r.prompts.size() * r.n) + ")");
}

void parse_chat(const json& b, const RequestLimits& limits, ParsedRequest& r) {
  const json* m = field(b, "messages");
  if (!m) reject("messages", "'messages' is required");
  if (!m->is_array()) wrong_type("messages", "an array of messages", *m);
  if (m->empty()) reject("messages", "'messages' must not be empty");
  if (static_cast<int64_t>(m->size()) > limits.max_messages)
    reject("messages", "'messages' may hold at most " + std::to_string(limits.max_messages) + " messages");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!e.is_object()) wrong_type(name, "an object", e);
    const json* role = field(e, "role");
    if (!role) reject(name + ".role", "'" + name + ".role' is required");
    infer::ChatMessage msg;
    msg.role = get_string(*role, name + ".role");
    if (msg.role.empty()) reject(name + ".role", "'" + name + ".role' must not be empty");
    if (const json* c = field(e, "content")) {
      if (c->is_string()) {
        msg.content = get_string(*c, name + ".content");
      } else if (c->is_array()) {
        // Content parts: only text parts can be rendered by a text model.
        for (size_t k = 0; k < c->size(); ++k) {
          const json& part = (*c)[k];
          const std::string pn = name + ".content[" + std::to_string(k) + "]";
          if (!part.is_object()) wrong_type(pn, "an object", part);
          const json* t = field(part, "type");
          if (!t || get_string(*t, pn + ".type") != "text") reject(pn, "'" + pn + "' must be a {\"type\": \"text\"} part");
          const json* text = field(part, "text");
          if (!text) reject(pn + ".text", "'" + pn + ".text' is required");
          msg.content += get_string(*text, pn + ".text");
        }
      } else {
        wrong_type(name + ".content", "a string or an array of text parts", *c);
      }
    } else if (msg.role != "assistant") {
      reject(name + ".content", "'" + name + ".content' is required");
    }
    r.messages.push_back(std::move(msg));
  }
  bool logprobs = false;
  if (const json* v = field(b, "logprobs")) logprobs = get_bool(*v, "logprobs");
  if (const json* v = field(b, "top_logprobs")) {
    const int k = static_cast<int>(get_int(*v, "top_logprobs", 0, 20));
    if (!logprobs) reject("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.top_logprobs = k;
  } else if (logprobs) {
    r.top_logprobs = 0;
  }
}

}  // namespace

ParseResult parse_request(Endpoint endpoint, std::string_view body, const RequestLimits& limits,
                          const std::vector<std::string>& models) {
  return guarded<ParsedRequest>([&] {
    const json b = parse_object(body);
    ParsedRequest r;
    r.endpoint = endpoint;
    r.model = resolve_model(b, models);
    parse_common(b, limits, r);
    if (r.format == OutputFormat::JsonSchema) r.schema = ordered_schema(body);
    if (endpoint == Endpoint::Completions) parse_completions(b, limits, r);
    else parse_chat(b, limits, r);
    return r;
  });
}

std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body, const std::vector<std::string>& models) {
  return guarded<TokenizeRequest>([&] {
    const json b = parse_object(body);
    TokenizeRequest r;
    r.model = resolve_model(b, models);
    const json* c = field(b, "content");
    if (!c) reject("content", "'content' is required");
    r.content = get_string(*c, "content");
    if (const json* v = field(b, "add_special")) r.add_special = get_bool(*v, "add_special");
    if (const json* v = field(b, "parse_special")) r.parse_special = get_bool(*v, "parse_special");
    if (const json* v = field(b, "with_pieces")) r.with_pieces = get_bool(*v, "with_pieces");
    return r;
  });
}

std::variant<ScoreRequest, ApiError> parse_score(std::string_view body, const RequestLimits& limits,
                                                 const std::vector<std::string>& models) {
  return guarded<ScoreRequest>([&] {
    const json b = parse_object(body);
    ScoreRequest r;
    r.model = resolve_model(b, models);
    const json* in = field(b, "input");
    if (!in) reject("input", "'input' is required (a string or a list of strings)");
    if (in->is_string()) {
      r.inputs.push_back(get_string(*in, "input"));
    } else if (in->is_array()) {
      if (in->empty()) reject("input", "'input' is an empty list");
      if (static_cast<int64_t>(in->size()) > limits.max_prompts)
        reject("input", "'input' holds " + std::to_string(in->size()) + " texts; at most " +
                            std::to_string(limits.max_prompts) + " per request");
      for (size_t i = 0; i < in->size(); ++i) r.inputs.push_back(get_string((*in)[i], "input[" + std::to_string(i) + "]"));
    } else {
      wrong_type("input", "a string or a list of strings", *in);
    }
    if (const json* v = field(b, "add_special")) r.add_special = get_bool(*v, "add_special");
    return r;
  });
}

std::variant<DetokenizeRequest, ApiError> parse_detokenize(std::string_view body,
                                                           const std::vector<std::string>& models) {
  return guarded<DetokenizeRequest>([&] {
    const json b = parse_object(body);
    DetokenizeRequest r;
    r.model = resolve_model(b, models);
    const json* t = field(b, "tokens");
    if (!t) reject("tokens", "'tokens' is required");
    if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
    r.tokens = get_ids(*t, "tokens");
    return r;
  });
}

}  // namespace corelm::serve
