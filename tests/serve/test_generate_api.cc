// Queue-native generate: POST /v1/generate returns one request id per prompt at once (one queue
// row each); POST /v1/generate/get_results long-polls until they are done, in the given order,
// with unknown ids reported per entry. Every completions parameter passes through (stop, choices,
// logprobs, n change the output as on /v1/completions), a bad parameter is a 400 naming it, and
// without --state-dir both endpoints are 404s naming the flag.
#include <gtest/gtest.h>

#include <cctype>
#include <set>

#include "serve/queue_serve_fixture.h"

namespace corelm::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::InProcessServer;

class GenerateApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("corelm_genapi_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    eos_ = testing::make_model_dir(root_ / "tiny");
    ServeOptions o;
    o.models = {(root_ / "tiny").string()};
    o.slots = 4;
    o.max_tokens_limit = 64;
    o.state_dir = (root_ / "state").string();
    o.queue_sync = queue::Sync::normal;
    server_ = new InProcessServer(o);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    fs::remove_all(root_);
  }
  static json no_eos() { return eos_ >= 0 ? json{{std::to_string(eos_), -100}} : json::object(); }
  static std::pair<int, json> post(const std::string& path, const json& body) { return server_->post(path, body); }
  // Submits and waits (long-poll); returns the results array.
  static json generate(const json& body) {
    auto [st, ids] = post("/v1/generate", body);
    EXPECT_EQ(st, 200) << ids.dump();
    if (st != 200) return json::array();
    auto [st2, res] = post("/v1/generate/get_results", {{"request_ids", ids["request_ids"]}, {"timeout", 20}});
    EXPECT_EQ(st2, 200);
    return res["results"];
  }
  static std::vector<std::string> texts(const json& results) {
    std::vector<std::string> out;
    for (const auto& r : results) {
      EXPECT_EQ(r["status"], "done") << r.dump();
      out.push_back(r["response"].is_object() ? r["response"]["choices"][0]["text"].get<std::string>() : "<none>");
    }
    return out;
  }

  static inline fs::path root_;
  static inline InProcessServer* server_ = nullptr;
  static inline int eos_ = -1;
};

TEST_F(GenerateApiTest, IdsAtOnceResultsInOrderWithLongPoll) {
  const std::vector<std::string> prompts = {"the cat", "a dog ran", "the market", "blue river", "storm night"};
  auto [st, ids] = post("/v1/generate", {{"model", "tiny"}, {"prompts", prompts}, {"max_tokens", 8}, {"seed", 1}});
  ASSERT_EQ(st, 200) << ids.dump();
  EXPECT_EQ(ids["object"], "list");
  ASSERT_EQ(ids["request_ids"].size(), prompts.size());
  std::set<std::string> distinct;
  for (const auto& id : ids["request_ids"]) {
    ASSERT_TRUE(id.is_string());
    EXPECT_EQ(id.get<std::string>().rfind("req-", 0), 0u);
    distinct.insert(id.get<std::string>());
  }
  EXPECT_EQ(distinct.size(), prompts.size());
  // Reversed order plus an unknown and a malformed id: answered in the order asked.
  json asked = json::array();
  for (auto it = ids["request_ids"].rbegin(); it != ids["request_ids"].rend(); ++it) asked.push_back(*it);
  asked.push_back("req-999999999");
  asked.push_back("bogus");
  auto [st2, res] = post("/v1/generate/get_results", {{"request_ids", asked}, {"timeout", 20}});
  ASSERT_EQ(st2, 200);
  const json& results = res["results"];
  ASSERT_EQ(results.size(), asked.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(results[i]["request_id"], asked[i]);
    EXPECT_EQ(results[i]["status"], "done");  // the long-poll returned once they were all done
    EXPECT_TRUE(results[i]["error"].is_null());
    // The response is the completion of that prompt, as /v1/completions gives it.
    const std::string& p = prompts[prompts.size() - 1 - i];
    auto [s3, direct] = post("/v1/completions", {{"model", "tiny"}, {"prompt", p}, {"max_tokens", 8}, {"seed", 1}});
    ASSERT_EQ(s3, 200);
    EXPECT_EQ(results[i]["response"]["choices"], direct["choices"]) << p;
    EXPECT_EQ(results[i]["response"]["object"], "text_completion");
  }
  for (size_t i = prompts.size(); i < asked.size(); ++i) {
    EXPECT_EQ(results[i]["request_id"], asked[i]);
    EXPECT_TRUE(results[i]["response"].is_null());
    EXPECT_EQ(results[i]["error"]["code"], "not_found");
  }
  // timeout 0: one look, at once.
  auto [st4, quick] = post("/v1/generate/get_results", {{"request_ids", ids["request_ids"]}});
  ASSERT_EQ(st4, 200);
  EXPECT_EQ(quick["results"].size(), prompts.size());
}

TEST_F(GenerateApiTest, SameSeedSameResultsAndSamplingParametersPassThrough) {
  const json base = {{"model", "tiny"}, {"prompts", {"the cat sat", "a dog"}}, {"max_tokens", 16}, {"temperature", 1.0},
                     {"seed", 42}, {"logit_bias", no_eos()}};
  const auto a = texts(generate(base));
  const auto b = texts(generate(base));
  EXPECT_EQ(a, b);
  json other = base;
  other["seed"] = 43;
  EXPECT_NE(texts(generate(other)), a);
  // No seed: the row's content seed, so two submissions of the same body agree too.
  json unseeded = base;
  unseeded.erase("seed");
  EXPECT_EQ(texts(generate(unseeded)), texts(generate(unseeded)));
  // choices constrains the output to one of the options.
  json choice = base;
  choice["choices"] = {"yes", "no"};
  for (const auto& t : texts(generate(choice))) EXPECT_TRUE(t == "yes" || t == "no") << t;
  // stop cuts the text where /v1/completions cuts it.
  const std::string first = a[0];
  ASSERT_GE(first.size(), 4u);
  // One ASCII character that first appears after the start (a valid UTF-8 stop string).
  std::string stop;
  for (size_t i = 1; i < first.size() && stop.empty(); ++i)
    if (std::isalpha(static_cast<unsigned char>(first[i])) && first.find(first[i]) == i) stop = first.substr(i, 1);
  ASSERT_FALSE(stop.empty()) << first;
  json stopped = base;
  stopped["stop"] = {stop};
  const auto cut = texts(generate(stopped));
  EXPECT_EQ(cut[0].find(stop), std::string::npos);
  EXPECT_LT(cut[0].size(), first.size());
  auto [st, direct] = post("/v1/completions", {{"model", "tiny"}, {"prompt", "the cat sat"}, {"max_tokens", 16},
                                                {"temperature", 1.0}, {"seed", 42}, {"logit_bias", no_eos()}, {"stop", {stop}}});
  ASSERT_EQ(st, 200);
  EXPECT_EQ(cut[0], direct["choices"][0]["text"]);
  // n and logprobs: every choice, with logprobs.
  json many = base;
  many["n"] = 2;
  many["logprobs"] = 1;
  many["max_tokens"] = 4;
  const json res = generate(many);
  ASSERT_EQ(res.size(), 2u);
  for (const auto& r : res) {
    ASSERT_EQ(r["response"]["choices"].size(), 2u);
    EXPECT_EQ(r["response"]["choices"][0]["logprobs"]["tokens"].size(), r["response"]["usage"]["completion_tokens"].get<int>() / 2);
  }
}

TEST_F(GenerateApiTest, BadRequestsNameTheParam) {
  struct Case {
    json body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"model", "tiny"}, {"prompts", {"a"}}, {"temperature", 9}}, "temperature"},
      {{{"model", "tiny"}, {"prompts", {"a"}}, {"top_p", -1}}, "top_p"},
      {{{"model", "tiny"}, {"prompts", {"a"}}, {"max_tokens", 100000}}, "max_tokens"},
      {{{"model", "tiny"}, {"prompts", {"a"}}, {"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {{{"model", "tiny"}, {"prompts", {"a", 7}}}, "prompts"},
      {{{"model", "tiny"}, {"prompts", json::array()}}, "prompts"},
      {{{"model", "tiny"}}, "prompts"},
      {{{"model", "tiny"}, {"prompts", {"a"}}, {"stream", true}}, "stream"},
      {{{"model", "tiny"}, {"prompt", "a"}, {"prompts", {"a"}}}, "prompt"},
      {{{"model", "ghost"}, {"prompts", {"a"}}}, "model"},
  };
  for (const auto& c : cases) {
    auto [st, err] = post("/v1/generate", c.body);
    EXPECT_TRUE(st == 400 || st == 404) << c.body.dump() << " -> " << st;
    EXPECT_EQ(err["error"]["param"], c.param) << c.body.dump() << " -> " << err.dump();
  }
  auto c = server_->client();
  auto r = c.Post("/v1/generate", "{not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  auto [st, err] = post("/v1/generate/get_results", {{"request_ids", {"req-1"}}, {"timeout", 61}});
  EXPECT_EQ(st, 400);
  EXPECT_EQ(err["error"]["param"], "timeout");
  auto [st2, err2] = post("/v1/generate/get_results", {{"request_ids", "req-1"}});
  EXPECT_EQ(st2, 400);
  EXPECT_EQ(err2["error"]["param"], "request_ids");
  // A prompt too long for the context is found by the worker: that entry fails, with the reason.
  std::string longp;
  for (int i = 0; i < 200; ++i) longp += "the cat sat on a mat ";
  const json res = generate({{"model", "tiny"}, {"prompts", {longp, "ok"}}, {"max_tokens", 4}});
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0]["status"], "failed");
  EXPECT_EQ(res[0]["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(res[1]["status"], "done");
}

TEST(GenerateApiNoQueue, NotFoundNamesTheStateDirFlag) {
  const fs::path root = fs::temp_directory_path() / ("corelm_genapi_noq_" + std::to_string(::getpid()));
  fs::remove_all(root);
  testing::make_model_dir(root / "tiny");
  ServeOptions o;
  o.models = {(root / "tiny").string()};
  {
    InProcessServer s(o);
    for (const char* path : {"/v1/generate", "/v1/generate/get_results"}) {
      auto [st, err] = s.post(path, {{"prompts", {"a"}}});
      EXPECT_EQ(st, 404);
      EXPECT_NE(err["error"]["message"].get<std::string>().find("--state-dir"), std::string::npos) << err.dump();
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace corelm::serve
