// The execution core (src/serve/executor.h) on its own: execute() on a tiny model gives the same
// choices as the server's non-streamed HTTP path, answers on the scheduler thread without
// blocking the caller, reproduces a run from default_seed, refuses stream: true and reports bad
// bodies as 400s naming the param.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "corelm/serve.h"
#include "serve/executor.h"
#include "serve/serve_fixture.h"

namespace corelm::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

class ExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("corelm_exec_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    eos_ = testing::make_model_dir(root_ / "tiny");
    options_.models = {(root_ / "tiny").string()};
    options_.port = 0;
    options_.slots = 4;
    options_.max_tokens_limit = 64;
    model_ = load_model_for_serving(options_.models[0], options_);
  }
  static void TearDownTestSuite() {
    model_.reset();
    fs::remove_all(root_);
  }

  struct Run {
    ExecResult result;
    std::thread::id thread;
    std::vector<infer::RequestId> ids;
  };
  static Run run(Endpoint ep, const json& body, ExecOptions eo = {}) {
    auto p = std::make_shared<std::promise<std::pair<ExecResult, std::thread::id>>>();
    auto f = p->get_future();
    Run out;
    out.ids = execute(*model_, ep, body.dump(), {"tiny"}, eo,
                      [p](ExecResult r) { p->set_value({std::move(r), std::this_thread::get_id()}); });
    EXPECT_EQ(f.wait_for(20s), std::future_status::ready);
    auto [r, t] = f.get();
    out.result = std::move(r);
    out.thread = t;
    return out;
  }
  static json no_eos() { return eos_ >= 0 ? json{{std::to_string(eos_), -100}} : json::object(); }

  static inline fs::path root_;
  static inline ServeOptions options_;
  static inline std::shared_ptr<LoadedModel> model_;
  static inline int eos_ = -1;
};

TEST_F(ExecutorTest, SameChoicesAsTheHttpNonStreamedPath) {
  Server server(options_);
  const int port = server.bind();
  std::thread t([&] { server.serve(); });
  struct Stop {
    Server& s;
    std::thread& t;
    ~Stop() {
      s.shutdown();
      t.join();
    }
  } stop{server, t};
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(20, 0);
  for (int i = 0; i < 500 && !server.ready(); ++i) std::this_thread::sleep_for(10ms);
  const std::vector<std::pair<Endpoint, json>> bodies = {
      {Endpoint::Completions,
       {{"model", "tiny"}, {"prompt", {"the cat sat", "a dog ran"}}, {"max_tokens", 12}, {"seed", 7}, {"n", 2},
        {"temperature", 0.8}, {"logprobs", 2}, {"logit_bias", no_eos()}}},
      {Endpoint::ChatCompletions,
       {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "the market"}}}}, {"max_tokens", 10}, {"seed", 3},
        {"top_p", 0.9}, {"stop", {"rose"}}}},
  };
  for (const auto& [ep, body] : bodies) {
    auto r = c.Post(ep == Endpoint::Completions ? "/v1/completions" : "/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json http = json::parse(r->body);
    ExecOptions eo;
    eo.limits.max_tokens_limit = 64;
    const Run e = run(ep, body, eo);
    ASSERT_EQ(e.result.status, 200);
    // As the server writes it: invalid UTF-8 of a partial token (logprobs) becomes U+FFFD.
    const json got = json::parse(e.result.body.dump(-1, ' ', false, json::error_handler_t::replace));
    EXPECT_EQ(got["choices"], http["choices"]);
    EXPECT_EQ(got["usage"], http["usage"]);
    EXPECT_EQ(got["object"], http["object"]);
    EXPECT_EQ(got["model"], "tiny");
    // `done` ran on the scheduler's thread, not the caller's.
    EXPECT_NE(e.thread, std::this_thread::get_id());
    EXPECT_FALSE(e.ids.empty());
  }
}

TEST_F(ExecutorTest, DefaultSeedReproducesAndIdIsTheCallers) {
  const json body = {{"model", "tiny"}, {"prompt", "the river"}, {"max_tokens", 16}, {"temperature", 1.0},
                     {"logit_bias", no_eos()}};
  ExecOptions eo;
  eo.default_seed = 12345;
  eo.response_id = "cmpl-fixed";
  eo.created = 1700000000;
  eo.priority = infer::SequenceRequest::kQueued;
  const Run a = run(Endpoint::Completions, body, eo);
  const Run b = run(Endpoint::Completions, body, eo);
  ASSERT_EQ(a.result.status, 200);
  EXPECT_EQ(a.result.body, b.result.body);  // id and created included
  EXPECT_EQ(a.result.body["id"], "cmpl-fixed");
  EXPECT_EQ(a.result.body["created"], 1700000000);
  // The default seed is the seed a body would give.
  json seeded = body;
  seeded["seed"] = 12345;
  const Run s = run(Endpoint::Completions, seeded, eo);
  EXPECT_EQ(s.result.body["choices"], a.result.body["choices"]);
  // A body's own seed wins over the default.
  seeded["seed"] = 999;
  const Run o = run(Endpoint::Completions, seeded, eo);
  EXPECT_NE(o.result.body["choices"], a.result.body["choices"]);
  // Without either, two runs draw different seeds (16 sampled tokens at temperature 1).
  const Run r1 = run(Endpoint::Completions, body), r2 = run(Endpoint::Completions, body);
  EXPECT_NE(r1.result.body["choices"], r2.result.body["choices"]);
  EXPECT_NE(r1.result.body["id"], r2.result.body["id"]);
}

TEST_F(ExecutorTest, StreamIsRefusedAndBadBodiesName400Params) {
  struct Case {
    Endpoint ep;
    json body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {Endpoint::Completions, {{"model", "tiny"}, {"prompt", "a"}, {"stream", true}}, 400, "stream"},
      {Endpoint::Completions, {{"model", "tiny"}, {"prompt", "a"}, {"temperature", 7}}, 400, "temperature"},
      {Endpoint::Completions, {{"model", "tiny"}, {"prompt", "a"}, {"max_tokens", 200}}, 400, "max_tokens"},
      {Endpoint::Completions, {{"model", "tiny"}, {"prompt", "a"}, {"logit_bias", {{"100000", 1}}}}, 400, "logit_bias"},
      {Endpoint::Completions, {{"model", "tiny"}, {"prompt", "a"}, {"regex", "("}}, 400, "regex"},
      {Endpoint::Completions, {{"model", "nope"}, {"prompt", "a"}}, 404, "model"},
      {Endpoint::ChatCompletions, {{"model", "tiny"}, {"messages", "hi"}}, 400, "messages"},
  };
  for (const auto& c : cases) {
    const Run r = run(c.ep, c.body);
    EXPECT_EQ(r.result.status, c.status) << c.body.dump() << " -> " << r.result.body.dump();
    EXPECT_EQ(r.result.body["error"]["param"], c.param) << c.body.dump() << " -> " << r.result.body.dump();
    EXPECT_TRUE(r.ids.empty());
    EXPECT_EQ(r.thread, std::this_thread::get_id());  // found before submission: answered at once
  }
  const Run bad = run(Endpoint::Completions, json("not an object"));
  EXPECT_EQ(bad.result.status, 400);
  EXPECT_EQ(model_of("{\"model\":\"x\",\"prompt\":1}"), "x");
  EXPECT_EQ(model_of("{\"model\":3}"), "");
  EXPECT_EQ(model_of("not json"), "");
}

}  // namespace
}  // namespace corelm::serve

namespace corelm::serve {
namespace {

// --cache-type-k/-v reach each served model's decoder: every model by default, one model by its
// id; a type the model's head_dim cannot hold fails at load naming the model and the flags.
TEST(ExecutorCacheTypes, EachModelGetsItsTypesAndMisfitsNameTheModel) {
  const fs::path root = fs::temp_directory_path() / ("corelm_exec_kv_" + std::to_string(::getpid()));
  fs::remove_all(root);
  testing::make_model_dir(root / "tiny");  // head_dim 16
  ServeOptions o;
  o.models = {(root / "tiny").string()};
  o.kv_cache_types = {model::KVCacheType::Turbo3, model::KVCacheType::BF16};
  auto a = load_model_for_serving(o.models[0], o);
  EXPECT_EQ(a->ckpt.model.decoder.kv_cache_types().k, model::KVCacheType::Turbo3);
  EXPECT_EQ(a->ckpt.model.decoder.kv_cache_types().v, model::KVCacheType::BF16);
  o.kv_cache_types_by_model["tiny"] = {model::KVCacheType::F16, model::KVCacheType::Turbo4};
  auto b = load_model_for_serving(o.models[0], o);
  EXPECT_EQ(b->ckpt.model.decoder.kv_cache_types().k, model::KVCacheType::F16);
  EXPECT_EQ(b->ckpt.model.decoder.kv_cache_types().v, model::KVCacheType::Turbo4);
  o.kv_cache_types_by_model["other"] = {model::KVCacheType::Q8_0, model::KVCacheType::Q8_0};  // not this model
  EXPECT_NO_THROW(load_model_for_serving(o.models[0], o));
  o.kv_cache_types_by_model["tiny"] = {model::KVCacheType::Q8_0, model::KVCacheType::F32};  // 32-blocks > 16
  try {
    load_model_for_serving(o.models[0], o);
    ADD_FAILURE() << "q8_0 accepted for head_dim 16";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tiny"), std::string::npos) << m;
    EXPECT_NE(m.find("--cache-type-k"), std::string::npos) << m;
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace corelm::serve
