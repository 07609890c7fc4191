// The server with a hybrid model (issue 17: sliding-window and linear-attention layers, whose
// caches hold rings and recurrent states that cannot forget padding): prompts of different lengths
// in one request, and requests arriving together, each get exactly the greedy text the prompt gets
// alone; streamed chunks concatenate to the non-streamed text.
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

class ServeHybridTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("corelm_serve_hybrid_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    eos_ = testing::make_model_dir(root_ / "tiny");
    // The same folder's weights as a hybrid: linear, sliding (window 3), linear layers.
    model::ModelConfig c = model::ModelConfig::load((root_ / "tiny" / "config.json").string());
    c.num_hidden_layers = 3;
    c.layers = {model::LayerSpec{model::AttentionKind::Linear, 0, 16, model::FfnKind::Dense},
                model::LayerSpec{model::AttentionKind::Sliding, 3, 0, model::FfnKind::Dense},
                model::LayerSpec{model::AttentionKind::Linear, 0, 16, model::FfnKind::Dense}};
    model::Decoder d(c);
    d.init_weights(13);
    fs::create_directories(root_ / "hyb");
    fs::copy_file(root_ / "tiny" / "tokenizer.json", root_ / "hyb" / "tokenizer.json");
    model::save_model_dir((root_ / "hyb").string(), d);
    ServeOptions o;
    o.models = {(root_ / "hyb").string()};
    o.port = 0;
    o.slots = 4;
    o.max_tokens_limit = 64;
    server_ = new Server(o);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->serve(); });
    httplib::Client cl("127.0.0.1", port_);
    for (int i = 0; i < 500; ++i) {
      auto r = cl.Get("/health");
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
  static std::pair<int, json> post(const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r) return {-1, {}};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  static json no_eos() { return eos_ >= 0 ? json{{std::to_string(eos_), -100}} : json::object(); }

  static inline fs::path root_;
  static inline Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
  static inline int port_ = 0;
  static inline int eos_ = -1;
};

TEST_F(ServeHybridTest, EachPromptGetsItsSoloTextInABatchAndUnderConcurrency) {
  // The folder the server runs is the hybrid (its config names the corelm architecture).
  EXPECT_EQ(model::ModelConfig::load((root_ / "hyb" / "config.json").string()).layers.size(), 3u);
  EXPECT_NE(testing::read_text(root_ / "hyb" / "config.json").find("corelm_hybrid"), std::string::npos);
  const std::vector<std::string> prompts = {"the cat", "a dog ran fast on the blue river", "stone",
                                            "market prices rose and the team won the new game at night"};
  std::vector<std::string> solo;
  for (const auto& p : prompts) {
    auto [st, r] = post({{"prompt", p}, {"max_tokens", 8}, {"temperature", 0}, {"logit_bias", no_eos()}});
    ASSERT_EQ(st, 200) << r.dump();
    solo.push_back(r["choices"][0]["text"]);
    EXPECT_FALSE(solo.back().empty()) << p;
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  }
  // One request holding every prompt (prefilled together by the scheduler).
  auto [st, batch] = post({{"prompt", prompts}, {"max_tokens", 8}, {"temperature", 0}, {"logit_bias", no_eos()}});
  ASSERT_EQ(st, 200) << batch.dump();
  ASSERT_EQ(batch["choices"].size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(batch["choices"][i]["text"], solo[i]) << prompts[i];
  // Separate requests at once: they share decode steps in the scheduler.
  std::vector<std::string> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      auto [s, r] = post({{"prompt", prompts[i]}, {"max_tokens", 8}, {"temperature", 0}, {"logit_bias", no_eos()}});
      if (s == 200) got[i] = r["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], solo[i]) << prompts[i];
  // Streamed: the chunks concatenate to the non-streamed text.
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(30, 0);
  json body = {{"prompt", prompts[1]}, {"max_tokens", 8}, {"temperature", 0}, {"logit_bias", no_eos()},
               {"stream", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string text = r->body, joined;
  size_t pos = 0;
  while ((pos = text.find("data: ")) != std::string::npos) {
    const size_t end = text.find("\n\n", pos);
    const std::string e = text.substr(pos + 6, end - pos - 6);
    text = text.substr(end + 2);
    if (e == "[DONE]") continue;
    const json ch = json::parse(e);
    if (!ch["choices"].empty() && ch["choices"][0].contains("text")) joined += ch["choices"][0]["text"];
  }
  EXPECT_EQ(joined, solo[1]);
}

}  // namespace
}  // namespace corelm::serve
