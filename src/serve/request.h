// Parsing and validation of the OpenAI-shaped request bodies: one pure function from the JSON
// text (plus the server's limits and the model ids it serves) to an internal request or an
// ApiError in OpenAI's error shape. No I/O, no model access, no file path ever read from a
// request, so it is unit-tested and fuzzed on its own (fuzz/serve_request_fuzz.cc). Checks that
// need the model (prompt length against the context, logit_bias ids against the vocabulary) are
// made by the server after tokenization.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/chat_template.h"
#include "corelm/token_ids.h"

namespace corelm::serve {

// {"error":{"message","type","param","code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
  nlohmann::json to_json() const;
};

// An error whose `type` follows from its status: authentication_error (401), rate_limit_error
// (429), server_error (5xx), else invalid_request_error.
ApiError api_error(int status, std::string message, std::string param = "", std::string code = "");

enum class Endpoint { Completions, ChatCompletions };

struct RequestLimits {
  int max_n = 16;                    // min(16, slots) on a server
  int64_t max_tokens_limit = 4096;   // --max-tokens-limit
  int max_stop = 4;                  // OpenAI's bound
  int max_prompts = 64;              // entries of a completions prompt list
  int max_messages = 1024;
  int max_logit_bias = 1024;
  int max_choices = 256;             // the corelm `choices` extension
};

// A completions prompt: text, or token ids given directly (OpenAI accepts both).
struct Prompt {
  std::string text;
  std::vector<TokenId> ids;
  bool is_ids = false;
};

enum class OutputFormat { Text, JsonObject, JsonSchema, Regex, Choices };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;                        // a served id ("" never: resolved or an error)
  std::vector<Prompt> prompts;              // completions: one entry per prompt
  std::vector<infer::ChatMessage> messages; // chat
  std::optional<int64_t> max_tokens;        // absent: the endpoint's default
  float temperature = 1.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool seed_given = false;
  int n = 1;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  // -1: no logprobs; otherwise the number of alternatives per token (completions `logprobs`,
  // chat `top_logprobs` with `logprobs: true`).
  int top_logprobs = -1;
  float presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<TokenId, float>> logit_bias;
  std::string user;
  bool echo = false;
  OutputFormat format = OutputFormat::Text;
  // json_schema, in the body's key order: properties are generated in schema order.
  nlohmann::ordered_json schema;
  std::string regex;
  std::vector<std::string> choices;
};

using ParseResult = std::variant<ParsedRequest, ApiError>;

// `models`: the ids the server knows (a missing "model" resolves to the only one when there is
// exactly one); an id not in the list is a 404.
ParseResult parse_request(Endpoint endpoint, std::string_view body, const RequestLimits& limits,
                          const std::vector<std::string>& models);

// Body of /tokenize and /detokenize (llama-server's shapes).
struct TokenizeRequest {
  std::string model, content;
  bool add_special = false, parse_special = false, with_pieces = false;
};
struct DetokenizeRequest {
  std::string model;
  std::vector<TokenId> tokens;
};
// Body of /v1/score (corelm's): {"model", "input": string | [strings], "add_special": false}.
// The log-likelihood of each text under the model, as `corelm run score` and the C ABI's
// corelm_score compute it (the same default: no BOS unless add_special).
struct ScoreRequest {
  std::string model;
  std::vector<std::string> inputs;
  bool add_special = false;
};
std::variant<ScoreRequest, ApiError> parse_score(std::string_view body, const RequestLimits& limits,
                                                 const std::vector<std::string>& models);

std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body, const std::vector<std::string>& models);
std::variant<DetokenizeRequest, ApiError> parse_detokenize(std::string_view body,
                                                           const std::vector<std::string>& models);

}  // namespace corelm::serve
