// The server in-process (serve::Server on a free loopback port) driven by httplib::Client: the
// OpenAI response shapes, usage counts, streaming (chunks concatenate to the non-streamed text,
// one id, role first, finish_reason last, usage, [DONE]), tokenize/detokenize, metrics, slots,
// errors, and the drain that refuses new requests.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <cmath>
#include <fstream>
#include <thread>

#include "corelm/serve.h"
#include "serve/in_process_server.h"
#include "serve/serve_fixture.h"

namespace corelm::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("corelm_serve_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    eos_ = testing::make_model_dir(root_ / "tiny");
    ServeOptions o;
    o.models = {(root_ / "tiny").string()};
    o.port = 0;
    o.slots = 4;
    o.max_tokens_limit = 64;
    server_ = new testing::InProcessServer();
    port_ = server_->start(o);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    fs::remove_all(root_);
  }

  static httplib::Client client() { return testing::loopback_client(port_); }
  static std::pair<int, json> post(const std::string& path, const json& body) {
    return testing::post_json(port_, path, body);
  }
  // SSE events of a streamed response (the "data: " payloads, [DONE] included).
  static std::vector<std::string> stream(const std::string& path, const json& body, int* status = nullptr) {
    return testing::sse_payloads(port_, path, body, status);
  }

  // The content pieces of a streamed chat response.
  static std::vector<std::string> stream_events(const json& body) {
    std::vector<std::string> out;
    for (const auto& e : stream("/v1/chat/completions", body)) {
      if (e == "[DONE]") continue;
      const json c = json::parse(e);
      if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
        out.push_back(c["choices"][0]["delta"]["content"]);
    }
    return out;
  }

  static inline fs::path root_;
  static inline testing::InProcessServer* server_ = nullptr;
  static inline int port_ = 0;
  static inline int eos_ = -1;
  static json no_eos() { return eos_ >= 0 ? json{{std::to_string(eos_), -100}} : json::object(); }
};

TEST_F(ServeTest, HealthModelsAndTokenizeRoundTrip) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body), json({{"status", "ok"}}));
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json models = json::parse(m->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["object"], "model");
  auto [st, tok] = post("/tokenize", {{"content", "the cat sat on a mat"}});
  ASSERT_EQ(st, 200);
  ASSERT_TRUE(tok["tokens"].is_array());
  EXPECT_GT(tok["tokens"].size(), 0u);
  auto [st2, detok] = post("/detokenize", {{"tokens", tok["tokens"]}});
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(detok["content"], "the cat sat on a mat");
  auto [st3, err] = post("/detokenize", {{"tokens", {100000}}});
  EXPECT_EQ(st3, 400);
  EXPECT_EQ(err["error"]["param"], "tokens");
}

TEST_F(ServeTest, CompletionsShapeUsageAndDeterminism) {
  const json body = {{"model", "tiny"}, {"prompt", {"the cat", "a dog ran"}}, {"max_tokens", 6}, {"temperature", 0}, {"n", 2},
                     {"logit_bias", no_eos()}};
  auto [st, r] = post("/v1/completions", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(r["choices"].size(), 4u);
  int64_t completion = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_TRUE(r["choices"][i]["text"].is_string());
    const std::string f = r["choices"][i]["finish_reason"];
    EXPECT_TRUE(f == "stop" || f == "length") << f;
  }
  // Greedy: the n copies of one prompt agree.
  EXPECT_EQ(r["choices"][0]["text"], r["choices"][1]["text"]);
  auto [s1, t1] = post("/tokenize", {{"content", "the cat"}, {"add_special", true}});
  auto [s2, t2] = post("/tokenize", {{"content", "a dog ran"}, {"add_special", true}});
  const int64_t prompt_tokens = static_cast<int64_t>(t1["tokens"].size() + t2["tokens"].size());
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt_tokens);
  // EOS is banned by logit_bias: every choice runs to max_tokens.
  for (const auto& c : r["choices"]) EXPECT_EQ(c["finish_reason"], "length");
  completion = r["usage"]["completion_tokens"];
  EXPECT_EQ(completion, 4 * 6);
  EXPECT_EQ(r["usage"]["total_tokens"], prompt_tokens + completion);
  auto [st_again, again] = post("/v1/completions", body);
  ASSERT_EQ(st_again, 200);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(again["choices"][i]["text"], r["choices"][i]["text"]);
  // Sampling with a seed repeats; another seed (almost surely) differs somewhere.
  json sampled = {{"prompt", "the"}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 5}};
  auto [a1, s_a] = post("/v1/completions", sampled);
  auto [a2, s_b] = post("/v1/completions", sampled);
  ASSERT_EQ(a1, 200);
  EXPECT_EQ(s_a["choices"][0]["text"], s_b["choices"][0]["text"]);
}

TEST_F(ServeTest, StreamedChunksConcatenateToTheNonStreamedText) {
  json body = {{"prompt", "the river"}, {"max_tokens", 10}, {"temperature", 0}, {"logit_bias", no_eos()}};
  auto [st, whole] = post("/v1/completions", body);
  ASSERT_EQ(st, 200);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  int status = 0;
  auto events = stream("/v1/completions", body, &status);
  EXPECT_EQ(status, 200);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, id, finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    if (id.empty()) id = c["id"];
    EXPECT_EQ(c["id"], id);
    if (c.contains("usage") && !c["usage"].is_null()) {
      usage = c["usage"];
      continue;
    }
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage, whole["usage"]);
}

TEST_F(ServeTest, ChatNonStreamedAndStreamed) {
  json body = {{"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "the cat"}}}},
               {"max_tokens", 8}, {"temperature", 0}};
  auto [st, whole] = post("/v1/chat/completions", body);
  ASSERT_EQ(st, 200) << whole.dump();
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(whole["choices"][0]["message"]["content"].is_string());
  EXPECT_GT(whole["usage"]["prompt_tokens"].get<int>(), 4);
  body["stream"] = true;
  auto events = stream("/v1/chat/completions", body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string last_finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]);
    const auto& d = c["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) last_finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(last_finish, whole["choices"][0]["finish_reason"]);
  EXPECT_TRUE(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"].is_string());
}

TEST_F(ServeTest, StopStringCutsTheText) {
  // logit_bias +100 on one token makes greedy output that token over and over ("catcatcat..."),
  // so a stop string spanning two copies has a known cut.
  auto [s1, t] = post("/tokenize", {{"content", "market prices river stone storm night"}, {"with_pieces", true}});
  ASSERT_EQ(s1, 200);
  int id = -1;
  std::string piece;
  for (const auto& e : t["tokens"])
    if (e["piece"].is_string() && e["piece"].get<std::string>().size() > piece.size()) {
      id = e["id"];
      piece = e["piece"];
    }
  ASSERT_GE(piece.size(), 2u) << t.dump();
  json body = {{"prompt", "the"}, {"max_tokens", 8}, {"temperature", 0}, {"logit_bias", {{std::to_string(id), 100}}}};
  auto [st, whole] = post("/v1/completions", body);
  ASSERT_EQ(st, 200);
  std::string expect_full;
  for (int i = 0; i < 8; ++i) expect_full += piece;
  EXPECT_EQ(whole["choices"][0]["text"], expect_full);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  const std::string stop = piece.substr(piece.size() - 1) + piece.substr(0, 1);  // "tc"
  body["stop"] = {stop, "never-seen"};
  auto [st2, cut] = post("/v1/completions", body);
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(cut["choices"][0]["text"], expect_full.substr(0, expect_full.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  body["stream"] = true;
  std::string streamed;
  for (const auto& e : stream("/v1/completions", body))
    if (e != "[DONE]") streamed += json::parse(e)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, cut["choices"][0]["text"]);
}

TEST_F(ServeTest, LogprobsShapes) {
  auto [st, r] = post("/v1/completions", {{"prompt", "the"}, {"max_tokens", 4}, {"logprobs", 2}, {"logit_bias", no_eos()}});
  ASSERT_EQ(st, 200) << r.dump();
  const auto& lp = r["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.dump();
  EXPECT_EQ(lp["tokens"].size(), 4u);
  EXPECT_EQ(lp["token_logprobs"].size(), 4u);
  EXPECT_EQ(lp["top_logprobs"].size(), 4u);
  for (const auto& v : lp["token_logprobs"]) EXPECT_LE(v.get<double>(), 0.0);
  EXPECT_LE(lp["top_logprobs"][0].size(), 2u);
  auto [st2, c] = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3},
                                                {"logprobs", true}, {"top_logprobs", 3}, {"logit_bias", no_eos()}});
  ASSERT_EQ(st2, 200) << c.dump();
  const auto& content = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u) << c.dump();
  for (const auto& e : content) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_TRUE(e["bytes"].is_array());
    EXPECT_EQ(e["top_logprobs"].size(), 3u);
  }
}

TEST_F(ServeTest, ConstrainedChoices) {
  auto [st, r] = post("/v1/completions", {{"prompt", "the"}, {"max_tokens", 10}, {"choices", {"yes", "no"}}, {"n", 2},
                                          {"temperature", 1.0}, {"seed", 3}});
  if (st == 400 && r["error"]["code"] == "unsupported_grammar") GTEST_SKIP() << r.dump();
  ASSERT_EQ(st, 200) << r.dump();
  for (const auto& c : r["choices"]) {
    const std::string t = c["text"];
    EXPECT_TRUE(t == "yes" || t == "no") << t;
    EXPECT_EQ(c["finish_reason"], "stop");
  }
  const json schema = {{"type", "object"},
                       {"properties", {{"ok", {{"type", "boolean"}}}, {"n", {{"type", "integer"}}}}},
                       {"required", {"ok", "n"}}};
  for (bool stream : {false, true}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "json please"}}}}, {"max_tokens", 40}, {"stream", stream},
                 {"seed", 9}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
    std::string text;
    if (!stream) {
      auto [sj, rj] = post("/v1/chat/completions", body);
      if (sj == 400 && rj["error"]["code"] == "unsupported_grammar") GTEST_SKIP() << rj.dump();
      ASSERT_EQ(sj, 200) << rj.dump();
      text = rj["choices"][0]["message"]["content"];
      EXPECT_EQ(rj["choices"][0]["finish_reason"], "stop");
    } else {
      for (const auto& e : stream_events(body)) text += e;
    }
    json out = json::parse(text, nullptr, false);
    ASSERT_TRUE(out.is_object()) << text;
    EXPECT_TRUE(out["ok"].is_boolean()) << text;
    EXPECT_TRUE(out["n"].is_number_integer()) << text;
  }
  auto [st2, e] = post("/v1/completions", {{"prompt", "the"}, {"regex", "(unclosed"}});
  EXPECT_EQ(st2, 400);
  EXPECT_EQ(e["error"]["param"], "regex");
}

// Properties come out in the schema's key order, not sorted: the body is sent as text so its
// order is the one written here.
TEST_F(ServeTest, JsonSchemaKeepsPropertyOrder) {
  const std::string body = R"({"messages":[{"role":"user","content":"json please"}],"max_tokens":48,"seed":5,
      "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object",
      "properties":{"z":{"type":"integer"},"a":{"type":"boolean"}},"required":["z","a"]}}}})";
  auto c = client();
  auto r = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(r);
  const json rj = json::parse(r->body, nullptr, false);
  if (r->status == 400 && rj["error"]["code"] == "unsupported_grammar") GTEST_SKIP() << r->body;
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string text = rj["choices"][0]["message"]["content"];
  const auto out = nlohmann::ordered_json::parse(text, nullptr, false);
  ASSERT_TRUE(out.is_object()) << text;
  ASSERT_EQ(out.size(), 2u) << text;
  EXPECT_EQ(out.begin().key(), "z") << text;
  EXPECT_TRUE(out["z"].is_number_integer()) << text;
  EXPECT_TRUE(out["a"].is_boolean()) << text;
}

TEST_F(ServeTest, RequestErrors) {
  auto [s1, e1] = post("/v1/completions", {{"model", "nope"}, {"prompt", "x"}});
  EXPECT_EQ(s1, 404);
  EXPECT_EQ(e1["error"]["code"], "model_not_found");
  std::string longp;
  for (int i = 0; i < 200; ++i) longp += "the cat sat ";
  auto [s2, e2] = post("/v1/completions", {{"prompt", longp}});
  EXPECT_EQ(s2, 400);
  EXPECT_EQ(e2["error"]["code"], "context_length_exceeded");
  EXPECT_NE(e2["error"]["message"].get<std::string>().find("the context is 96 tokens"), std::string::npos)
      << e2.dump();
  auto [s3, e3] = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 65}});
  EXPECT_EQ(s3, 400);
  EXPECT_EQ(e3["error"]["param"], "max_tokens");
  auto [s4, e4] = post("/v1/completions", {{"prompt", "x"}, {"n", 5}});  // above --slots 4
  EXPECT_EQ(s4, 400);
  EXPECT_EQ(e4["error"]["param"], "n");
  auto [s5, e5] = post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"99999", 1}}}});
  EXPECT_EQ(s5, 400);
  EXPECT_EQ(e5["error"]["param"], "logit_bias");
  auto c = client();
  auto r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body).contains("error"));
  int status = 0;
  stream("/v1/completions", {{"prompt", 3}, {"stream", true}}, &status);
  EXPECT_EQ(status, 400);  // a streaming request's errors come as a status before any byte
}

TEST_F(ServeTest, MetricsAndSlots) {
  post("/v1/completions", {{"prompt", "the"}, {"max_tokens", 3}});
  auto c = client();
  // The request counter is written by the server's logger after the response went out: the
  // client can ask for /metrics a moment before it lands.
  auto m = c.Get("/metrics");
  for (int i = 0; i < 100 && m && m->body.find("endpoint=\"/v1/completions\",status=\"200\"") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = c.Get("/metrics");
  }
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  for (const char* name : {"corelm_requests_total{endpoint=\"/v1/completions\",status=\"200\"}", "corelm_prompt_tokens_total",
                           "corelm_generated_tokens_total", "corelm_tokens_per_second", "corelm_queue_depth",
                           "corelm_slots_busy", "corelm_kv_tokens_used", "corelm_time_to_first_token_seconds_bucket",
                           "corelm_inter_token_latency_seconds_count"})
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
  auto s = c.Get("/slots");
  ASSERT_TRUE(s);
  json slots = json::parse(s->body);
  ASSERT_TRUE(slots.is_array());
  ASSERT_GE(slots.size(), 1u);
  EXPECT_EQ(slots[0]["model"], "tiny");
  EXPECT_TRUE(slots[0].contains("state"));
}

TEST(ServeOptionsTest, ValidationAndIds) {
  EXPECT_EQ(model_id_for_path("/a/b/qwen.gguf"), "qwen");
  EXPECT_EQ(model_id_for_path("/a/b/mymodel/"), "mymodel");
  ServeOptions o;
  EXPECT_THROW(o.validate(), ValueError);  // no model
  o.models = {"x"};
  o.slots = 0;
  EXPECT_THROW(o.validate(), ValueError);
  o.slots = 2;
  EXPECT_NO_THROW(o.validate());
  EXPECT_THROW(Server{o}, IOError);  // the path does not exist
}

}  // namespace
}  // namespace corelm::serve

namespace corelm::serve {
namespace {

// Concurrent requests through HTTP give each the tokens it gets alone (batch invariance).
TEST_F(ServeTest, ConcurrentRequestsMatchSoloRuns) {
  std::vector<json> bodies;
  for (int i = 0; i < 6; ++i)
    bodies.push_back({{"prompt", std::string("the ") + (i % 2 ? "cat sat" : "river rose") + std::string(i, '!')},
                      {"max_tokens", 12}, {"temperature", i < 3 ? 0.0 : 1.0}, {"seed", 100 + i}, {"logit_bias", no_eos()}});
  std::vector<std::string> solo;
  for (const auto& b : bodies) solo.push_back(post("/v1/completions", b).second["choices"][0]["text"]);
  std::vector<std::string> together(bodies.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i)
    threads.emplace_back([&, i] { together[i] = post("/v1/completions", bodies[i]).second["choices"][0]["text"]; });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < bodies.size(); ++i) EXPECT_EQ(together[i], solo[i]) << i;
}

// --models-dir: every model listed, loaded on first use, at most --max-loaded held.
TEST(ServeModelsDir, LazyLoadAndLruBound) {
  const fs::path root = fs::temp_directory_path() / ("corelm_serve_dir_" + std::to_string(::getpid()));
  fs::remove_all(root);
  testing::make_model_dir(root / "models" / "alpha", {}, 1);
  testing::make_model_dir(root / "models" / "beta", {}, 2);
  fs::create_directories(root / "models" / "not-a-model");
  ServeOptions o;
  o.models_dir = (root / "models").string();
  o.max_loaded = 1;
  o.port = 0;
  o.slots = 2;
  Server server(o);
  const int port = server.bind();
  std::thread t([&] { server.serve(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(20, 0);
  auto status_of = [&](const std::string& id) {
    auto r = c.Get("/v1/models");
    const json list = json::parse(r->body);
    for (const auto& m : list["data"])
      if (m["id"] == id) return m["status"].get<std::string>();
    return std::string("absent");
  };
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);  // nothing to load at start
  EXPECT_EQ(status_of("alpha"), "unloaded");
  EXPECT_EQ(status_of("beta"), "unloaded");
  EXPECT_EQ(status_of("not-a-model"), "absent");
  auto ra = c.Post("/v1/completions", json({{"model", "alpha"}, {"prompt", "the"}, {"max_tokens", 2}}).dump(), "application/json");
  ASSERT_TRUE(ra);
  EXPECT_EQ(ra->status, 200) << ra->body;
  EXPECT_EQ(status_of("alpha"), "loaded");
  auto rb = c.Post("/v1/completions", json({{"model", "beta"}, {"prompt", "the"}, {"max_tokens", 2}}).dump(), "application/json");
  ASSERT_TRUE(rb);
  EXPECT_EQ(rb->status, 200) << rb->body;
  EXPECT_EQ(status_of("beta"), "loaded");
  EXPECT_EQ(status_of("alpha"), "unloaded");  // the LRU bound of 1
  auto rn = c.Post("/v1/completions", json({{"prompt", "the"}}).dump(), "application/json");
  ASSERT_TRUE(rn);
  EXPECT_EQ(rn->status, 400);  // two models: "model" is required
  server.shutdown();
  t.join();
  fs::remove_all(root);
}

// A --model that fails to load: /health says so (503 with the error), requests get 500.
TEST(ServeStartup, BrokenModelIsReportedNotFatal) {
  const fs::path root = fs::temp_directory_path() / ("corelm_serve_broken_" + std::to_string(::getpid()));
  fs::remove_all(root);
  testing::make_model_dir(root / "broken");
  { std::ofstream(root / "broken" / "model.safetensors", std::ios::trunc) << "garbage"; }
  ServeOptions o;
  o.models = {(root / "broken").string()};
  o.port = 0;
  Server server(o);
  const int port = server.bind();
  std::thread t([&] { server.serve(); });
  httplib::Client c("127.0.0.1", port);
  json health;
  for (int i = 0; i < 200; ++i) {
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 503);
    health = json::parse(h->body);
    if (health["status"] == "error") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(health["status"], "error");
  EXPECT_NE(health["error"].get<std::string>().find("model.safetensors"), std::string::npos) << health.dump();
  auto r = c.Post("/v1/completions", R"({"prompt":"x"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_load_failed");
  server.shutdown();
  t.join();
  fs::remove_all(root);
}

// POST /v1/score: the same numbers as `corelm run score` on the same texts (the same model,
// precision and encoding), a text's score independent of the others in its request, and the
// errors naming the input.
TEST_F(ServeTest, ScoreEqualsCorelmRunScoreAndNamesBadInputs) {
  const std::vector<std::string> texts = {"the cat sat on a mat", "dog ran fast", "blue river stone market prices rose"};
  auto [st, r] = post("/v1/score", {{"input", texts}});
  ASSERT_EQ(st, 200) << r.dump();
  ASSERT_EQ(r["object"], "list");
  ASSERT_EQ(r["data"].size(), texts.size());
  const fs::path in = root_ / "score_in.jsonl", out = root_ / "score_out";
  {
    std::ofstream f(in);
    for (const auto& t : texts) f << json{{"text", t}}.dump() << "\n";
  }
  const auto run = testing::run_corelm({"run", "score", "--model", (root_ / "tiny").string(), "--input", in.string(),
                                        "--out", out.string(), "--overwrite"},
                                       testing::CliOptions{60});
  ASSERT_EQ(run.rc, 0) << run.err;
  std::vector<json> want;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("part-", 0) == 0) {
      std::ifstream f(e.path());
      std::string line;
      while (std::getline(f, line)) want.push_back(json::parse(line));
    }
  ASSERT_EQ(want.size(), texts.size());
  int64_t total = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& got = r["data"][i];
    EXPECT_EQ(got["index"], i);
    EXPECT_EQ(got["tokens"], want[i]["tokens"]) << texts[i];
    const double m = want[i]["mean_logprob"].get<double>();
    EXPECT_NEAR(got["mean_logprob"].get<double>(), m, 1e-5 * std::max(1.0, std::abs(m))) << texts[i];
    EXPECT_NEAR(got["logprob"].get<double>(), m * got["tokens"].get<double>(), 1e-4 * std::max(1.0, std::abs(m)));
    EXPECT_NEAR(got["perplexity"].get<double>(), std::exp(-m), 1e-4 * std::exp(-m));
    EXPECT_LT(got["logprob"].get<double>(), 0);
    total += got["tokens"].get<int64_t>() + 1;
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], total);
  // Alone, the middle text scores exactly as in the list.
  auto [st1, one] = post("/v1/score", {{"input", texts[1]}});
  ASSERT_EQ(st1, 200);
  EXPECT_EQ(one["data"][0]["logprob"], r["data"][1]["logprob"]);
  // add_special prepends what the tokenizer configures (nothing here: the same score).
  EXPECT_EQ(post("/v1/score", {{"input", texts[1]}, {"add_special", true}}).first, 200);

  auto bad = [&](const json& body, int status, const std::string& param) {
    auto [s, e] = post("/v1/score", body);
    EXPECT_EQ(s, status) << body.dump() << " -> " << e.dump();
    EXPECT_EQ(e["error"]["param"], param) << e.dump();
  };
  bad(json::object(), 400, "input");
  bad({{"input", json::array()}}, 400, "input");
  bad({{"input", 3}}, 400, "input");
  bad({{"input", {"the cat", 7}}}, 400, "input[1]");
  bad({{"input", {"the cat", ""}}}, 400, "input[1]");  // no token: nothing to predict
  std::string longer;
  for (int i = 0; i < 200; ++i) longer += "market ";
  bad({{"input", longer}}, 400, "input");  // beyond the 96-token context
  bad({{"model", "nope"}, {"input", "the cat"}}, 404, "model");
  bad({{"input", "the cat"}, {"add_special", "yes"}}, 400, "add_special");
}

}  // namespace
}  // namespace corelm::serve
