// Queue-native generate: POST /v1/generate returns one request id per prompt at once (one queue
// row each); POST /v1/generate/get_results long-polls until they are done, in the given order,
// with unknown ids reported per entry. Every completions parameter passes through (stop, choices,
// logprobs, n change the output as on /v1/completions), a bad parameter is a 400 naming it, and
// without --state-dir both endpoints are 404s naming the flag.
#include <gtest/gtest.h>

#include <cctype>
#include <set>

#include "corelm/thread_pool.h"
#include "serve/executor.h"
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

TEST(GenerateApiFull, QueueFullIs429WithRetryAfterAndNothingQueued) {
  const fs::path root = fs::temp_directory_path() / ("corelm_genapi_full_" + std::to_string(::getpid()));
  fs::remove_all(root);
  testing::make_model_dir(root / "tiny");
  ServeOptions o;
  o.models = {(root / "tiny").string()};
  o.state_dir = (root / "state").string();
  o.max_queued = 3;
  o.queue_sync = queue::Sync::normal;
  {
    InProcessServer s(o);
    auto c = s.client();
    const json body = {{"model", "tiny"}, {"prompts", {"a", "b", "c", "d"}}, {"max_tokens", 2}};
    auto r = c.Post("/v1/generate", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 429);
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
    // All or nothing: the queue is still empty, and a call that fits is accepted.
    auto [st, ids] = s.post("/v1/generate", {{"model", "tiny"}, {"prompts", {"a", "b"}}, {"max_tokens", 2}});
    EXPECT_EQ(st, 200);
    EXPECT_EQ(ids["request_ids"].size(), 2u);
    EXPECT_EQ(ids["request_ids"][0], "req-1");
  }
  fs::remove_all(root);
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

namespace corelm::serve {
namespace {

// Queue overhead: the same 2,000 prompts (max_tokens 8, distinct, EOS suppressed so every one
// generates 8 tokens) through POST /v1/generate + get_results (queue rows, worker, executor,
// acks) and submitted to the Scheduler directly, on the tiny test model with 8 slots. Prints
// JSON. Run: test_serve --gtest_also_run_disabled_tests --gtest_filter='*QueueOverhead*'
// (pinned: taskset -c 0).
TEST(GenerateApiBench, DISABLED_QueueOverheadVsScheduler) {
  using Clock = std::chrono::steady_clock;
  set_num_threads(1);
  const fs::path root = fs::temp_directory_path() / ("corelm_genbench_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const int eos = testing::make_model_dir(root / "tiny");
  const int kPrompts = 2000, kTokens = 8;
  std::vector<std::string> prompts;
  for (int i = 0; i < kPrompts; ++i) prompts.push_back("the cat " + std::to_string(i) + " sat");
  ServeOptions o;
  o.models = {(root / "tiny").string()};
  o.slots = 8;
  json out = {{"prompts", kPrompts}, {"max_tokens", kTokens}, {"slots", o.slots}};

  {  // The scheduler alone.
    ServeOptions d = o;
    d.max_queue = kPrompts;
    auto m = load_model_for_serving(o.models[0], d);
    struct Count : infer::RequestObserver {
      std::mutex mu;
      std::condition_variable cv;
      int done = 0;
      int64_t tokens = 0;
      void on_finished(int, const std::string&, const std::string&, int64_t n) override {
        std::lock_guard<std::mutex> l(mu);
        ++done;
        tokens += n;
        cv.notify_all();
      }
    };
    auto count = std::make_shared<Count>();
    const auto t0 = Clock::now();
    for (int i = 0; i < kPrompts; ++i) {
      infer::SequenceRequest r;
      EncodeOptions eo;
      eo.add_special = true;
      r.prompt = m->ckpt.model.tokenizer->encode(prompts[i], eo);
      r.max_new_tokens = kTokens;
      r.seed = static_cast<uint64_t>(i);
      if (eos >= 0) r.logit_bias = {{static_cast<TokenId>(eos), -100.0f}};
      r.eos_ids = m->eos_ids;
      m->scheduler->submit(std::move(r), count);
    }
    std::unique_lock<std::mutex> l(count->mu);
    count->cv.wait(l, [&] { return count->done == kPrompts; });
    out["scheduler_s"] = std::chrono::duration<double>(Clock::now() - t0).count();
    out["scheduler_tokens"] = count->tokens;
  }
  for (const auto& [name, sync] : {std::pair{"full", queue::Sync::full}, std::pair{"normal", queue::Sync::normal}}) {
    ServeOptions q = o;
    q.state_dir = (root / (std::string("state_") + name)).string();
    q.queue_sync = sync;
    InProcessServer s(q);
    const json no_eos = eos >= 0 ? json{{std::to_string(eos), -100}} : json::object();
    const auto t0 = Clock::now();
    auto [st, ids] = s.post("/v1/generate", {{"model", "tiny"}, {"prompts", prompts}, {"max_tokens", kTokens}, {"logit_bias", no_eos}});
    ASSERT_EQ(st, 200);
    const double submit_s = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t tokens = 0;
    for (;;) {
      auto [st2, res] = s.post("/v1/generate/get_results", {{"request_ids", ids["request_ids"]}, {"timeout", 60}});
      ASSERT_EQ(st2, 200);
      bool all = true;
      tokens = 0;
      for (const auto& r : res["results"]) {
        all = all && r["status"] == "done";
        if (r["response"].is_object()) tokens += r["response"]["usage"]["completion_tokens"].get<int64_t>();
      }
      if (all) break;
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    out[std::string("queue_") + name + "_s"] = secs;
    out[std::string("queue_") + name + "_submit_s"] = submit_s;
    out[std::string("queue_") + name + "_tokens"] = tokens;
    out[std::string("queue_") + name + "_ratio"] = secs / out["scheduler_s"].get<double>();
    out[std::string("queue_") + name + "_overhead_us_per_request"] =
        (secs - out["scheduler_s"].get<double>()) * 1e6 / kPrompts;
  }
  std::printf("%s\n", out.dump().c_str());
  fs::remove_all(root);
}

}  // namespace
}  // namespace corelm::serve
