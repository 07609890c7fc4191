// The server in-process (serve::Server on a free loopback port) driven by httplib::Client: the
// OpenAI response shapes, usage counts, streaming (chunks concatenate to the non-streamed text,
// one id, role first, finish_reason last, usage, [DONE]), tokenize/detokenize, metrics, slots,
// errors, and the drain that refuses new requests.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "corelm/serve.h"
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
    server_ = new Server(o);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->serve(); });
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 500; ++i) {
      auto r = c.Get("/health");
      if (r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  static void TearDownTestSuite() {
    if (server_) server_->shutdown();
    if (thread_) thread_->join();
    delete thread_;
    delete server_;
    fs::remove_all(root_);
  }

  static httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(20, 0);
    return c;
  }
  static std::pair<int, json> post(const std::string& path, const json& body) {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, {}};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // SSE events of a streamed response (the "data: " payloads, [DONE] included).
  static std::vector<std::string> stream(const std::string& path, const json& body, int* status = nullptr) {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    std::vector<std::string> events;
    if (status) *status = r ? r->status : -1;
    if (!r) return events;
    std::string text = r->body;
    size_t pos = 0;
    while ((pos = text.find("data: ")) != std::string::npos) {
      const size_t end = text.find("\n\n", pos);
      events.push_back(text.substr(pos + 6, end - pos - 6));
      text = text.substr(end + 2);
    }
    return events;
  }

  static inline fs::path root_;
  static inline Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
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
  json body = {{"prompt", "the cat"}, {"max_tokens", 40}, {"temperature", 0}, {"logit_bias", no_eos()}};
  auto [st, whole] = post("/v1/completions", body);
  ASSERT_EQ(st, 200);
  const std::string text = whole["choices"][0]["text"];
  // Two ASCII characters from the second half (a byte-level model may emit any bytes).
  std::string stop;
  for (size_t i = text.size() / 2; i + 1 < text.size() && stop.empty(); ++i)
    if (static_cast<unsigned char>(text[i]) < 128 && static_cast<unsigned char>(text[i + 1]) < 128 && text[i] >= ' ')
      stop = text.substr(i, 2);
  if (stop.empty()) GTEST_SKIP() << "no ASCII pair in the generated text to use as a stop string";
  body["stop"] = stop;
  auto [st2, cut] = post("/v1/completions", body);
  ASSERT_EQ(st2, 200);
  const std::string got = cut["choices"][0]["text"];
  EXPECT_EQ(got, text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
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
  auto m = c.Get("/metrics");
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
