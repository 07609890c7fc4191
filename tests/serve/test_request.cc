// The request parser on its own: every parameter's type and range check names the parameter,
// the limits hold, unknown fields are ignored, and the OpenAI shapes map to the internal request.
#include <gtest/gtest.h>

#include <string>

#include "serve/request.h"

namespace corelm::serve {
namespace {

const std::vector<std::string> kModels{"tiny"};

ParsedRequest ok(Endpoint e, const std::string& body, RequestLimits l = {}) {
  ParseResult r = parse_request(e, body, l, kModels);
  if (auto* err = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << err->message;
  return std::holds_alternative<ParsedRequest>(r) ? std::get<ParsedRequest>(r) : ParsedRequest{};
}

ApiError bad(Endpoint e, const std::string& body, RequestLimits l = {}) {
  ParseResult r = parse_request(e, body, l, kModels);
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << body << " was accepted";
    return {};
  }
  return std::get<ApiError>(r);
}

constexpr Endpoint C = Endpoint::Completions;
constexpr Endpoint Chat = Endpoint::ChatCompletions;

TEST(ServeRequest, CompletionsFieldsMap) {
  auto r = ok(C, R"({"model":"tiny","prompt":"hi","max_tokens":7,"temperature":0,"top_p":0.5,"seed":42,"n":2,
                     "stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},"logprobs":3,
                     "presence_penalty":1.5,"frequency_penalty":-1,"logit_bias":{"5":-100,"17":2.5},"user":"me",
                     "some_future_field":{"x":1}})");
  EXPECT_EQ(r.model, "tiny");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hi");
  EXPECT_EQ(r.max_tokens.value_or(-1), 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.presence_penalty, 1.5f);
  EXPECT_EQ(r.frequency_penalty, -1.0f);
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.user, "me");
  EXPECT_EQ(r.format, OutputFormat::Text);
}

TEST(ServeRequest, PromptForms) {
  EXPECT_EQ(ok(C, R"({"prompt":["a","b","c"]})").prompts.size(), 3u);
  auto ids = ok(C, R"({"prompt":[1,2,3]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_ids);
  EXPECT_EQ(ids.prompts[0].ids, (std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(ok(C, R"({"prompt":[[1],[2,3]]})").prompts.size(), 2u);
  EXPECT_EQ(ok(C, R"({"prompt":"x","stop":"\n"})").stop, std::vector<std::string>{"\n"});
  // The only model is the default; max_completion_tokens wins over max_tokens.
  EXPECT_EQ(ok(C, R"({"prompt":"x","max_tokens":3,"max_completion_tokens":5})").max_tokens.value_or(0), 5);
  // null means "not given".
  EXPECT_FALSE(ok(C, R"({"prompt":"x","max_tokens":null,"seed":null})").seed_given);
}

TEST(ServeRequest, ChatMessagesAndLogprobs) {
  auto r = ok(Chat, R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},
                        {"type":"text","text":"b"}]},{"role":"assistant","content":null}],"logprobs":true,"top_logprobs":4})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_EQ(ok(Chat, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})").top_logprobs, 0);
  EXPECT_EQ(ok(Chat, R"({"messages":[{"role":"user","content":"x"}]})").top_logprobs, -1);
  EXPECT_EQ(bad(Chat, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})").param, "top_logprobs");
}

TEST(ServeRequest, Grammars) {
  auto js = ok(Chat, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
                         "json_schema":{"name":"n","strict":true,"schema":{"type":"object"}}}})");
  EXPECT_EQ(js.format, OutputFormat::JsonSchema);
  EXPECT_EQ(js.schema, nlohmann::ordered_json({{"type", "object"}}));
  EXPECT_EQ(ok(C, R"({"prompt":"x","response_format":{"type":"json_object"}})").format, OutputFormat::JsonObject);
  EXPECT_EQ(ok(C, R"({"prompt":"x","response_format":{"type":"text"}})").format, OutputFormat::Text);
  EXPECT_EQ(ok(C, R"({"prompt":"x","regex":"[0-9]+"})").format, OutputFormat::Regex);
  auto ch = ok(C, R"({"prompt":"x","choices":["yes","no"]})");
  EXPECT_EQ(ch.format, OutputFormat::Choices);
  EXPECT_EQ(ch.choices.size(), 2u);
  EXPECT_EQ(bad(C, R"({"prompt":"x","regex":"a","choices":["b"]})").param, "choices");
  EXPECT_EQ(bad(C, R"({"prompt":"x","response_format":{"type":"xml"}})").param, "response_format");
  EXPECT_EQ(bad(C, R"({"prompt":"x","response_format":{"type":"json_schema"}})").param, "response_format");
  EXPECT_EQ(bad(C, R"({"prompt":"x","choices":[]})").param, "choices");
}

// The schema keeps the body's key order (the grammar emits properties in that order), also when
// other members of the body share its key names; duplicate keys keep the last value, as
// everywhere else in the body.
TEST(ServeRequest, SchemaKeepsKeyOrder) {
  auto js = ok(Chat, R"({"schema":1,"messages":[{"role":"user","content":"x","schema":{"b":1}}],
                         "response_format":{"schema":2,"type":"json_schema","json_schema":{"schema":{"type":"object",
                         "properties":{"z":{"type":"integer"},"a":{"type":"boolean"},"m":{"type":"string"}},
                         "required":["z","a"]},"name":"n"}},"json_schema":{"schema":3}})");
  ASSERT_EQ(js.format, OutputFormat::JsonSchema);
  std::vector<std::string> keys, props;
  for (auto it = js.schema.begin(); it != js.schema.end(); ++it) keys.push_back(it.key());
  for (auto it = js.schema["properties"].begin(); it != js.schema["properties"].end(); ++it) props.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"type", "properties", "required"}));
  EXPECT_EQ(props, (std::vector<std::string>{"z", "a", "m"}));
  auto dup = ok(Chat, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
                          "json_schema":{"schema":{"type":"string"}}},"response_format":{"type":"json_schema",
                          "json_schema":{"schema":{"type":"object","properties":{"y":{},"b":{}}}}}})");
  EXPECT_EQ(dup.schema.dump(), R"({"type":"object","properties":{"y":{},"b":{}}})");
}

// Parsing an object in key order is quadratic in its size: a schema object over the bound is a
// 400 before that parse.
TEST(ServeRequest, SchemaObjectSizeIsBounded) {
  auto body = [](int members) {
    std::string props;
    for (int i = 0; i < members; ++i) props += (i ? ",\"p" : "\"p") + std::to_string(i) + "\":{}";
    return R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object",
              "properties":{)" + props + "}}}}}";
  };
  EXPECT_EQ(ok(C, body(512)).schema["properties"].size(), 512u);
  const ApiError e = bad(C, body(513));
  EXPECT_EQ(e.param, "response_format");
  EXPECT_NE(e.message.find("513 members, above the limit of 512"), std::string::npos) << e.message;
  // So is the nesting (copies of a json value recurse), also where the compiler never looks; the
  // check itself does not recurse.
  auto nested = [](int levels) {
    return R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":{"description":)" +
           std::string(levels, '[') + std::string(levels, ']') + "}}}}";
  };
  EXPECT_EQ(ok(C, nested(63)).format, OutputFormat::JsonSchema);
  EXPECT_NE(bad(C, nested(64)).message.find("nested deeper than 64 levels"), std::string::npos);
  EXPECT_NE(bad(C, nested(100000)).message.find("nested deeper than 64 levels"), std::string::npos);
}

TEST(ServeRequest, WrongTypesNameTheParameter) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":"x","max_tokens":"5"})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":2.5})", "max_tokens"},
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","top_p":[1]})", "top_p"},
      {R"({"prompt":"x","n":true})", "n"},
      {R"({"prompt":"x","stop":7})", "stop"},
      {R"({"prompt":"x","stop":["a",1]})", "stop[1]"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stream_options":{"include_usage":1}})", "stream_options.include_usage"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","logit_bias":[1]})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"3":"x"}})", "logit_bias[3]"},
      {R"({"prompt":"x","user":5})", "user"},
      {R"({"prompt":"x","seed":"1"})", "seed"},
      {R"({"prompt":["a",3]})", "prompt[1]"},
      {R"({"prompt":[1,"a"]})", "prompt[1]"},
      {R"({"prompt":"x","model":7})", "model"},
      {R"({"prompt":"x","regex":7})", "regex"},
  };
  for (const auto& c : cases) {
    ApiError e = bad(C, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
  }
  struct ChatCase {
    const char* body;
    const char* param;
  } chat_cases[] = {
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[5]})", "messages[0]"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0]"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":3})", "logprobs"},
  };
  for (const auto& c : chat_cases) {
    ApiError e = bad(Chat, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
  }
}

TEST(ServeRequest, Limits) {
  RequestLimits l;
  l.max_n = 4;
  l.max_tokens_limit = 100;
  EXPECT_EQ(bad(C, R"({"prompt":"x","n":5})", l).param, "n");
  EXPECT_EQ(bad(C, R"({"prompt":"x","n":0})", l).param, "n");
  EXPECT_EQ(bad(C, R"({"prompt":"x","max_tokens":101})", l).param, "max_tokens");
  EXPECT_EQ(bad(C, R"({"prompt":"x","max_tokens":0})", l).param, "max_tokens");
  EXPECT_EQ(bad(C, R"({"prompt":"x","max_tokens":18446744073709551615})", l).param, "max_tokens");
  EXPECT_EQ(bad(C, R"({"prompt":"x","stop":["a","b","c","d","e"]})", l).param, "stop");
  EXPECT_EQ(bad(C, R"({"prompt":"x","stop":""})", l).param, "stop");
  EXPECT_EQ(bad(C, R"({"prompt":"x","temperature":2.5})", l).param, "temperature");
  EXPECT_EQ(bad(C, R"({"prompt":"x","top_p":0})", l).param, "top_p");
  EXPECT_EQ(bad(C, R"({"prompt":"x","presence_penalty":3})", l).param, "presence_penalty");
  EXPECT_EQ(bad(C, R"({"prompt":"x","logprobs":6})", l).param, "logprobs");
  EXPECT_EQ(bad(C, R"({"prompt":"x","logit_bias":{"1":101}})", l).param, "logit_bias[1]");
  EXPECT_EQ(bad(C, R"({"prompt":"x","logit_bias":{"99999999999":1}})", l).param, "logit_bias");
  EXPECT_EQ(bad(C, R"({"prompt":[-1]})", l).param, "prompt[0]");
  EXPECT_EQ(bad(C, R"({"prompt":[]})", l).param, "prompt");
  EXPECT_EQ(bad(Chat, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":21,"logprobs":true})", l).param,
            "top_logprobs");
}

TEST(ServeRequest, BodyAndModelErrors) {
  ApiError e = bad(C, "{not json");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("not valid JSON"), std::string::npos);
  EXPECT_EQ(bad(C, "[1,2]").status, 400);
  EXPECT_EQ(bad(C, "").status, 400);
  EXPECT_EQ(bad(C, R"({"prompt":"x"} trailing)").status, 400);
  // Invalid UTF-8 inside a string, raw or as a lone surrogate escape.
  ApiError u = bad(C, "{\"prompt\":\"\xff\xfe\"}");
  EXPECT_EQ(u.status, 400);
  EXPECT_NE(u.message.find("UTF-8"), std::string::npos) << u.message;
  EXPECT_EQ(bad(C, R"({"prompt":"\ud800"})").status, 400);
  ApiError m = bad(C, R"({"model":"nope","prompt":"x"})");
  EXPECT_EQ(m.status, 404);
  EXPECT_EQ(m.code, "model_not_found");
  EXPECT_EQ(m.param, "model");
  // Two models and none named: 400.
  ParseResult two = parse_request(C, R"({"prompt":"x"})", {}, {"a", "b"});
  ASSERT_TRUE(std::holds_alternative<ApiError>(two));
  EXPECT_EQ(std::get<ApiError>(two).param, "model");
  EXPECT_EQ(bad(C, R"({"model":"tiny"})").param, "prompt");
  // Deep nesting is rejected or parsed, never a crash.
  std::string deep(100000, '[');
  EXPECT_EQ(bad(C, deep).status, 400);
}

TEST(ServeRequest, ErrorJsonShape) {
  ApiError e = bad(C, R"({"prompt":"x","n":"2"})");
  const nlohmann::json j = e.to_json();
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"].contains("code"));
  ApiError none;
  none.message = "m";
  EXPECT_TRUE(none.to_json()["error"]["param"].is_null());
}

TEST(ServeRequest, TokenizeBodies) {
  auto t = parse_tokenize(R"({"content":"abc","add_special":true})", kModels);
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_EQ(std::get<TokenizeRequest>(t).content, "abc");
  EXPECT_TRUE(std::get<TokenizeRequest>(t).add_special);
  auto te = parse_tokenize(R"({"content":1})", kModels);
  ASSERT_TRUE(std::holds_alternative<ApiError>(te));
  EXPECT_EQ(std::get<ApiError>(te).param, "content");
  auto d = parse_detokenize(R"({"tokens":[1,2]})", kModels);
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(d));
  EXPECT_EQ(std::get<DetokenizeRequest>(d).tokens.size(), 2u);
  auto de = parse_detokenize(R"({"tokens":[1,"x"]})", kModels);
  ASSERT_TRUE(std::holds_alternative<ApiError>(de));
  EXPECT_EQ(std::get<ApiError>(de).param, "tokens[1]");
}

}  // namespace
}  // namespace corelm::serve
