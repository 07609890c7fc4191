// The server with a hybrid model (issue 17: sliding-window and linear-attention layers, whose
// caches hold rings and recurrent states that cannot forget padding): prompts of different lengths
// in one request, and requests arriving together, each get exactly the greedy text the prompt gets
// alone; streamed chunks concatenate to the non-streamed text.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "corelm/serve.h"
#include "serve/in_process_server.h"
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
    server_ = new testing::InProcessServer();
    port_ = server_->start(o);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    fs::remove_all(root_);
  }
  static std::pair<int, json> post(const json& body) { return testing::post_json(port_, "/v1/completions", body, 30); }
  static json no_eos() { return eos_ >= 0 ? json{{std::to_string(eos_), -100}} : json::object(); }

  static inline fs::path root_;
  static inline testing::InProcessServer* server_ = nullptr;
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
  const json body = {{"prompt", prompts[1]}, {"max_tokens", 8},        {"temperature", 0},
                     {"logit_bias", no_eos()}, {"stream", true}};
  std::string joined;
  for (const std::string& e : testing::sse_payloads(port_, "/v1/completions", body, nullptr, 30)) {
    if (e == "[DONE]") continue;
    const json ch = json::parse(e);
    if (!ch["choices"].empty() && ch["choices"][0].contains("text")) joined += ch["choices"][0]["text"];
  }
  EXPECT_EQ(joined, solo[1]);
}

}  // namespace
}  // namespace corelm::serve
