// The Batches API without a model: the input-line validator, and the Files/Batches HTTP routes
// and batch state machine over a real queue, with the test acting as the queue's worker.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "serve/batch_api.h"

using corelm::queue::NewRequest;
using corelm::serve::BatchLineError;
using corelm::serve::parse_batch_line;
using corelm::serve::RequestLimits;

namespace {

const std::vector<std::string> kModels{"tiny", "other"};

std::variant<NewRequest, BatchLineError> parse(const std::string& line, const std::string& endpoint = "/v1/completions") {
  return parse_batch_line(line, 7, endpoint, kModels, RequestLimits{});
}

BatchLineError error_of(const std::string& line, const std::string& endpoint = "/v1/completions") {
  auto r = parse(line, endpoint);
  if (auto* e = std::get_if<BatchLineError>(&r)) return *e;
  ADD_FAILURE() << "accepted: " << line;
  return {};
}

std::string line_of(const nlohmann::json& j) { return j.dump(); }

nlohmann::json good_line() {
  return {{"custom_id", "req-1"},
          {"method", "POST"},
          {"url", "/v1/completions"},
          {"body", {{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 4}}}};
}

}  // namespace

TEST(BatchLine, AcceptsACompletionsAndAChatLine) {
  auto r = parse(line_of(good_line()));
  ASSERT_TRUE(std::holds_alternative<NewRequest>(r)) << std::get<BatchLineError>(r).message;
  const NewRequest& n = std::get<NewRequest>(r);
  EXPECT_EQ(n.model, "tiny");
  EXPECT_EQ(n.custom_id, "req-1");
  EXPECT_EQ(n.endpoint, "/v1/completions");
  EXPECT_FALSE(n.batch_id.has_value());
  EXPECT_EQ(nlohmann::json::parse(n.body), good_line()["body"]);

  nlohmann::json chat = {{"custom_id", "c"},
                         {"method", "POST"},
                         {"url", "/v1/chat/completions"},
                         {"body", {{"model", "other"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}}};
  auto c = parse(line_of(chat), "/v1/chat/completions");
  ASSERT_TRUE(std::holds_alternative<NewRequest>(c)) << std::get<BatchLineError>(c).message;
  EXPECT_EQ(std::get<NewRequest>(c).endpoint, "/v1/chat/completions");
  EXPECT_EQ(std::get<NewRequest>(c).model, "other");
  // "" (the offline `corelm run batch`) takes either endpoint.
  EXPECT_TRUE(std::holds_alternative<NewRequest>(parse(line_of(chat), "")));
  EXPECT_TRUE(std::holds_alternative<NewRequest>(parse(line_of(good_line()), "")));
}

TEST(BatchLine, BodyIsCompactInLineOrderSoSpacingDoesNotDefeatDedup) {
  std::string spaced = R"({ "custom_id" : "a", "method":"POST", "url":"/v1/completions",
    "body" : { "prompt" : "x",   "model" : "tiny", "max_tokens" : 2 } })";
  auto r = parse(spaced);
  ASSERT_TRUE(std::holds_alternative<NewRequest>(r));
  EXPECT_EQ(std::get<NewRequest>(r).body, R"({"prompt":"x","model":"tiny","max_tokens":2})");
}

TEST(BatchLine, AModelIsResolvedWhenTheServerHasOne) {
  auto r = parse_batch_line(R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x"}})", 1,
                            "/v1/completions", {"only"}, RequestLimits{});
  ASSERT_TRUE(std::holds_alternative<NewRequest>(r));
  EXPECT_EQ(std::get<NewRequest>(r).model, "only");
}

TEST(BatchLine, EachInvalidLineNamesItsCodeLineAndParam) {
  struct Case {
    std::string line, code, param, in_message;
  };
  auto with = [](const char* key, nlohmann::json v) {
    nlohmann::json j = good_line();
    if (v.is_discarded()) j.erase(key);
    else j[key] = v;
    return j.dump();
  };
  nlohmann::json drop = nlohmann::json(nlohmann::json::value_t::discarded);
  nlohmann::json body = good_line()["body"];
  const std::vector<Case> cases = {
      {"{not json", "invalid_json", "", "not valid JSON"},
      {"", "invalid_json", "", "not valid JSON"},
      {"[1,2]", "invalid_json", "", "must be a JSON object"},
      {"\"\xff\"", "invalid_json", "", "not valid JSON"},
      {std::string(5000, '[') + std::string(5000, ']'), "invalid_json", "", "deeper"},
      {with("custom_id", drop), "missing_required_parameter", "custom_id", "'custom_id' is required"},
      {with("custom_id", 12), "invalid_custom_id", "custom_id", "must be a string"},
      {with("custom_id", ""), "invalid_custom_id", "custom_id", "empty"},
      {with("method", "GET"), "invalid_method", "method", "\"GET\""},
      {with("method", drop), "missing_required_parameter", "method", "'method' is required"},
      {with("url", "/v1/embeddings"), "invalid_url", "url", "/v1/embeddings"},
      {with("url", "/v1/chat/completions"), "invalid_url", "url", "does not match the batch's endpoint"},
      {with("url", drop), "missing_required_parameter", "url", "'url' is required"},
      {with("body", drop), "missing_required_parameter", "body", "'body' is required"},
      {with("body", "text"), "invalid_request", "body", "must be a JSON object"},
      {with("body", {{"model", "nope"}, {"prompt", "x"}}), "model_not_found", "body.model", "'nope' does not exist"},
      {with("body", {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", -3}}), "invalid_request", "body.max_tokens", ""},
      {with("body", {{"model", "tiny"}, {"prompt", "x"}, {"stream", true}}), "invalid_request", "body.stream", "stream"},
      {with("body", {{"model", "tiny"}}), "invalid_request", "body.prompt", ""},
  };
  for (const Case& c : cases) {
    BatchLineError e = error_of(c.line);
    EXPECT_EQ(e.code, c.code) << c.line.substr(0, 200) << " -> " << e.message;
    EXPECT_EQ(e.param, c.param) << c.line.substr(0, 200) << " -> " << e.message;
    EXPECT_EQ(e.line, 7);
    EXPECT_NE(e.message.find("line 7"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find(c.in_message), std::string::npos) << e.message;
  }
  // Brackets inside strings are not nesting.
  nlohmann::json j = good_line();
  j["body"]["prompt"] = std::string(1000, '[');
  EXPECT_TRUE(std::holds_alternative<NewRequest>(parse(j.dump())));
}
