// The continuous-batching Scheduler on a small random model and a BPE tokenizer trained in the
// test: every request's tokens equal a solo run (and TextGenerator's) whatever else is running,
// staggered arrivals, cancellation, slot recycling, chunked prefill, prefix-cache hits, n > 1,
// stop strings, admission control, logprobs, penalties and logit_bias.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/generate_fixtures.h"
#include "common/model_factories.h"
#include "corelm/autograd.h"
#include "corelm/generate.h"
#include "corelm/model.h"
#include "corelm/scheduler.h"
#include "corelm/thread_pool.h"
#include "corelm/tokenizer.h"

namespace corelm::infer {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Records every callback; wait() blocks (bounded) until every sequence has finished or an error came.
class Recorder : public RequestObserver {
 public:
  explicit Recorder(int n = 1) : tokens(n), texts(n), streamed(n), reasons(n), logprobs(n), tops(n), counts(n, -1) {}

  void on_prefilled(int64_t prompt, int64_t cached) override {
    std::lock_guard<std::mutex> l(mu);
    prefilled = true;
    prompt_tokens = prompt;
    cached_tokens = cached;
  }
  void on_token(int i, TokenId t, const std::string& text, const TokenLogprob* lp,
                const std::vector<TokenLogprob>* top) override {
    if (block_first_token) {
      std::unique_lock<std::mutex> l(mu);
      cv.wait_for(l, 20s, [&] { return released; });
    }
    std::lock_guard<std::mutex> l(mu);
    tokens[i].push_back(t);
    streamed[i] += text;
    if (lp) logprobs[i].push_back(*lp);
    if (top) tops[i].push_back(*top);
    ++token_events;
    cv.notify_all();
  }
  void on_finished(int i, const std::string& reason, const std::string& text, int64_t completion) override {
    std::lock_guard<std::mutex> l(mu);
    reasons[i] = reason;
    texts[i] = text;
    counts[i] = completion;
    ++finished;
    cv.notify_all();
  }
  void on_error(const std::string& m) override {
    std::lock_guard<std::mutex> l(mu);
    error = m;
    cv.notify_all();
  }
  bool wait(std::chrono::seconds limit = 30s) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, limit, [&] { return finished == static_cast<int>(tokens.size()) || !error.empty(); });
  }
  bool wait_tokens(int k, std::chrono::seconds limit = 30s) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, limit, [&] { return token_events >= k || finished > 0; });
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    released = true;
    cv.notify_all();
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<TokenId>> tokens;
  std::vector<std::string> texts, streamed, reasons;
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::vector<std::vector<std::vector<TokenLogprob>>> tops;
  std::vector<int64_t> counts;
  int finished = 0, token_events = 0;
  bool prefilled = false;
  int64_t prompt_tokens = 0, cached_tokens = -1;
  std::string error;
  std::atomic<bool> block_first_token{false};
  bool released = false;
};

std::string training_text() {
  const std::vector<std::string> words = {"the", "cat", "sat", "on", "a", "mat", "café", "naïve", "日本", "語",
                                          "über", "and", "dog", "ran"};
  return testing::pseudo_text(words, 88172645463325252ull, 3000, 11);
}

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::path dir = fs::temp_directory_path() / ("corelm_sched_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    tokenizer_ = testing::train_small_bpe(dir, training_text(), 300).release();
    fs::remove_all(dir);
    model_ = new model::Decoder(testing::tiny_decoder_config(static_cast<int64_t>(tokenizer_->vocab_size()), 0.2));
    model_->init_weights(1234);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokenizer_;
    model_ = nullptr;
    tokenizer_ = nullptr;
  }

  static std::vector<TokenId> prompt(int64_t n, uint64_t seed) {
    std::vector<TokenId> p;
    for (int64_t id : testing::random_ids(n, static_cast<int64_t>(tokenizer_->vocab_size()), seed))
      p.push_back(static_cast<TokenId>(id));
    return p;
  }
  static SequenceRequest greedy(std::vector<TokenId> p, int64_t n_new) {
    SequenceRequest r;
    r.prompt = std::move(p);
    r.max_new_tokens = n_new;
    r.sampling.greedy = true;
    r.stop_at_eos = false;
    return r;
  }
  static SequenceRequest sampled(std::vector<TokenId> p, int64_t n_new, uint64_t seed) {
    SequenceRequest r = greedy(std::move(p), n_new);
    r.sampling.greedy = false;
    r.sampling.temperature = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.95f;
    r.seed = seed;
    return r;
  }
  static GenerateOptions gen_options(const SequenceRequest& r) {
    GenerateOptions o;
    o.max_new_tokens = r.max_new_tokens;
    o.sampling = r.sampling;
    o.seed = r.seed;
    o.stop = r.stop;
    o.stop_at_eos = r.stop_at_eos;
    return o;
  }
  static SchedulerOptions small_options() {
    SchedulerOptions o;
    o.slots = 4;
    o.prefill_chunk = 8;
    o.step_token_budget = 16;
    o.prefix_cache_blocks = 32;
    return o;
  }
  // Runs one request alone on a fresh scheduler.
  static std::shared_ptr<Recorder> solo(const SequenceRequest& r, SchedulerOptions o = small_options()) {
    o.prefix_cache_blocks = 0;
    Scheduler s(*model_, *tokenizer_, o);
    auto rec = std::make_shared<Recorder>(r.n);
    s.submit(r, rec);
    EXPECT_TRUE(rec->wait());
    return rec;
  }

  static model::Decoder* model_;
  static Tokenizer* tokenizer_;
};
model::Decoder* SchedulerTest::model_ = nullptr;
Tokenizer* SchedulerTest::tokenizer_ = nullptr;

TEST_F(SchedulerTest, ChunkedPrefillGivesTheSameLastLogitsAsOneForward) {
  autograd::NoGradGuard no_grad;
  const auto p = prompt(45, 3);
  const std::vector<int64_t> ids(p.begin(), p.end());
  for (bool fast : {false, true}) {
    model::Decoder d(model_->config());
    for (const auto& [name, t] : model_->named_parameters()) d.load_parameter(name, t);
    if (fast) d.prepare_inference();
    model::KVCache one(d.config(), 1, 64), chunked(d.config(), 1, 64);
    Tensor whole = d.forward_cached(Tensor::from_vector(ids, {1, 45}), one, {0}, model::Logits::Last).contiguous();
    Tensor last;
    for (int64_t b = 0; b < 45; b += 8) {
      const int64_t n = std::min<int64_t>(8, 45 - b);
      std::vector<int64_t> chunk(ids.begin() + b, ids.begin() + b + n);
      last = d.forward_cached(Tensor::from_vector(chunk, {1, n}), chunked, {0}, model::Logits::Last).contiguous();
    }
    const int64_t V = d.config().vocab_size;
    int64_t differ = 0;
    for (int64_t i = 0; i < V; ++i) differ += whole.data<float>()[i] != last.data<float>()[i];
    EXPECT_EQ(differ, 0) << (fast ? "fast path" : "reference path") << ": chunked prefill changed " << differ << " of "
                         << V << " logits";
  }
}

TEST_F(SchedulerTest, SoloRunEqualsTextGenerator) {
  TextGenerator gen(*model_, *tokenizer_);
  for (int64_t len : {3, 8, 21}) {
    for (bool samp : {false, true}) {
      SequenceRequest r = samp ? sampled(prompt(len, 10 + len), 20, 99) : greedy(prompt(len, 10 + len), 20);
      auto rec = solo(r);
      auto want = gen.generate_ids({r.prompt}, gen_options(r)).front();
      EXPECT_EQ(rec->tokens[0], want.tokens) << "prompt of " << len << (samp ? " sampled" : " greedy");
      EXPECT_EQ(rec->texts[0], want.text);
      EXPECT_EQ(rec->streamed[0], rec->texts[0]);
      EXPECT_EQ(rec->reasons[0], want.finish_reason);
      EXPECT_EQ(rec->counts[0], static_cast<int64_t>(want.tokens.size()));
    }
  }
}

TEST_F(SchedulerTest, StaggeredArrivalsEachEqualASoloRun) {
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    const int64_t len = 2 + (i * 7) % 30;
    reqs.push_back(i % 2 ? sampled(prompt(len, 100 + i), 6 + i % 5 * 4, 500 + i) : greedy(prompt(len, 100 + i), 8 + i % 3 * 5));
  }
  std::vector<std::shared_ptr<Recorder>> want;
  for (const auto& r : reqs) want.push_back(solo(r));
  for (bool fast_budget : {false, true}) {
    SchedulerOptions o = small_options();
    if (fast_budget) o.step_token_budget = 64;
    Scheduler s(*model_, *tokenizer_, o);
    std::vector<std::shared_ptr<Recorder>> got;
    for (size_t i = 0; i < reqs.size(); ++i) {
      got.push_back(std::make_shared<Recorder>());
      s.submit(reqs[i], got.back());
      // Join while the previous ones are decoding.
      if (i % 3 == 0) {
        ASSERT_TRUE(got.back()->wait_tokens(2));
      }
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(got[i]->wait());
      EXPECT_EQ(got[i]->tokens[0], want[i]->tokens[0]) << "request " << i;
      EXPECT_EQ(got[i]->texts[0], want[i]->texts[0]) << "request " << i;
    }
    ASSERT_TRUE(s.drain(std::chrono::steady_clock::now() + 10s));  // the books are closed after on_finished
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.requests_finished, reqs.size());
    EXPECT_EQ(st.slots_busy, 0);
  }
}

TEST_F(SchedulerTest, LastChunksOfDifferentLengthsShareAPaddedForward) {
  SchedulerOptions o = small_options();
  o.slots = 5;
  o.step_token_budget = 64;
  for (bool fast : {false, true}) {
    model::Decoder d(model_->config());
    for (const auto& [name, t] : model_->named_parameters()) d.load_parameter(name, t);
    if (fast) d.prepare_inference();
    TextGenerator gen(d, *tokenizer_);
    Scheduler s(d, *tokenizer_, o);
    auto blocker = std::make_shared<Recorder>();
    blocker->block_first_token = true;
    s.submit(greedy(prompt(3, 1), 2), blocker);
    std::this_thread::sleep_for(20ms);  // the loop now waits in the blocker's first token
    std::vector<SequenceRequest> reqs;
    std::vector<std::shared_ptr<Recorder>> got;
    for (int64_t len : {5, 7, 4, 14}) {  // admitted together: last chunks of 5, 7, 4 and 6 tokens
      reqs.push_back(len % 2 ? sampled(prompt(len, len), 8, 3) : greedy(prompt(len, len), 8));
      got.push_back(std::make_shared<Recorder>());
      s.submit(reqs.back(), got.back());
    }
    blocker->release();
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(got[i]->wait());
      EXPECT_EQ(got[i]->tokens[0], gen.generate_ids({reqs[i].prompt}, gen_options(reqs[i])).front().tokens)
          << "request " << i << (fast ? " fast path" : " reference path");
    }
  }
}

// A hybrid decoder (linear + sliding layers: rings and states that cannot forget padding, no
// prefix blocks): last chunks of different lengths still give each request its solo tokens.
TEST_F(SchedulerTest, HybridCacheChunksOfDifferentLengthsEqualSoloRuns) {
  SchedulerOptions o = small_options();
  o.slots = 5;
  o.step_token_budget = 64;
  model::ModelConfig hc = model_->config();
  hc.layers.assign(static_cast<size_t>(hc.num_hidden_layers), model::LayerSpec{model::AttentionKind::Sliding, 3, 0,
                                                                                 model::FfnKind::Dense});
  hc.layers[0] = model::LayerSpec{model::AttentionKind::Linear, 0, 8, model::FfnKind::Dense};
  for (bool fast : {false, true}) {
    model::Decoder d(hc);
    d.init_weights(5);
    if (fast) d.prepare_inference();
    TextGenerator gen(d, *tokenizer_);
    Scheduler s(d, *tokenizer_, o);
    auto blocker = std::make_shared<Recorder>();
    blocker->block_first_token = true;
    s.submit(greedy(prompt(3, 1), 2), blocker);
    std::this_thread::sleep_for(20ms);
    std::vector<SequenceRequest> reqs;
    std::vector<std::shared_ptr<Recorder>> got;
    for (int64_t len : {5, 7, 4, 14}) {
      reqs.push_back(len % 2 ? sampled(prompt(len, len), 8, 3) : greedy(prompt(len, len), 8));
      got.push_back(std::make_shared<Recorder>());
      s.submit(reqs.back(), got.back());
    }
    blocker->release();
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(got[i]->wait());
      EXPECT_EQ(got[i]->error, "") << "request " << i;
      EXPECT_EQ(got[i]->tokens[0], gen.generate_ids({reqs[i].prompt}, gen_options(reqs[i])).front().tokens)
          << "request " << i << (fast ? " fast path" : " reference path");
    }
  }
}

TEST_F(SchedulerTest, SlotRecyclingServesMoreRequestsThanSlots) {
  SchedulerOptions o = small_options();
  o.slots = 3;
  Scheduler s(*model_, *tokenizer_, o);
  std::vector<std::shared_ptr<Recorder>> got;
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(greedy(prompt(4 + i, 40 + i), 5 + i % 4));
    got.push_back(std::make_shared<Recorder>());
    s.submit(reqs.back(), got.back());
  }
  EXPECT_LE(s.stats().slots_busy, 3);
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(got[i]->wait());
    EXPECT_EQ(got[i]->tokens[0], solo(reqs[i])->tokens[0]) << "request " << i;
  }
  ASSERT_TRUE(s.drain(std::chrono::steady_clock::now() + 10s));
  const auto st = s.stats();
  EXPECT_EQ(st.requests_finished, 12u);
  EXPECT_EQ(st.slots_busy, 0);
  EXPECT_EQ(st.kv_tokens_used, 0);
  for (const SlotInfo& slot : s.slots()) EXPECT_EQ(slot.state, "idle");
}

TEST_F(SchedulerTest, CancelQueuedAndRunning) {
  SchedulerOptions o = small_options();
  o.slots = 1;
  Scheduler s(*model_, *tokenizer_, o);
  auto running = std::make_shared<Recorder>();
  running->block_first_token = true;  // holds the loop inside the first on_token
  const RequestId a = s.submit(greedy(prompt(5, 1), 40), running);
  auto queued = std::make_shared<Recorder>();
  const RequestId b = s.submit(greedy(prompt(5, 2), 10), queued);
  auto other = std::make_shared<Recorder>();
  const SequenceRequest other_req = greedy(prompt(6, 3), 10);
  s.submit(other_req, other);
  s.cancel(b);
  s.cancel(a);
  running->release();
  ASSERT_TRUE(running->wait());
  ASSERT_TRUE(queued->wait());
  ASSERT_TRUE(other->wait());
  EXPECT_EQ(running->reasons[0], "cancelled");
  EXPECT_LT(running->tokens[0].size(), 40u);
  EXPECT_EQ(running->texts[0], running->streamed[0]);
  EXPECT_EQ(queued->reasons[0], "cancelled");
  EXPECT_TRUE(queued->tokens[0].empty());
  EXPECT_EQ(other->reasons[0], "length");
  EXPECT_EQ(other->tokens[0], solo(other_req)->tokens[0]);
  ASSERT_TRUE(s.drain(std::chrono::steady_clock::now() + 10s));
  const auto st = s.stats();
  EXPECT_EQ(st.requests_cancelled, 2u);
  EXPECT_EQ(st.slots_busy, 0);
  s.cancel(a);  // finished / unknown ids are ignored
  s.cancel(12345);
}

// Waiting requests are admitted by priority, FIFO within one: with one slot held, low-priority
// requests queued first still start after high-priority ones queued later.
TEST_F(SchedulerTest, HigherPriorityIsAdmittedFirstFifoWithinAPriority) {
  SchedulerOptions o = small_options();
  o.slots = 1;
  Scheduler s(*model_, *tokenizer_, o);
  auto blocker = std::make_shared<Recorder>();
  blocker->block_first_token = true;  // holds the only slot until released
  s.submit(greedy(prompt(5, 1), 3), blocker);
  const auto until = std::chrono::steady_clock::now() + 20s;  // admitted: it holds the slot now
  while (s.stats().queued != 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(s.stats().queued, 0);
  std::mutex order_mu;
  std::vector<std::string> order;
  struct Tagged : Recorder {
    Tagged(std::string t, std::mutex& m, std::vector<std::string>& o) : tag(std::move(t)), mu_(m), order_(o) {}
    void on_prefilled(int64_t p, int64_t c) override {
      {
        std::lock_guard<std::mutex> l(mu_);
        order_.push_back(tag);
      }
      Recorder::on_prefilled(p, c);
    }
    std::string tag;
    std::mutex& mu_;
    std::vector<std::string>& order_;
  };
  std::vector<std::shared_ptr<Tagged>> recs;
  const std::vector<std::pair<std::string, int>> plan = {{"q1", SequenceRequest::kQueued}, {"q2", SequenceRequest::kQueued},
                                                         {"i1", SequenceRequest::kInteractive}, {"q3", SequenceRequest::kQueued},
                                                         {"i2", SequenceRequest::kInteractive}, {"x", 5}};
  for (size_t k = 0; k < plan.size(); ++k) {
    SequenceRequest r = greedy(prompt(4, 10 + k), 2);
    r.priority = plan[k].second;
    recs.push_back(std::make_shared<Tagged>(plan[k].first, order_mu, order));
    s.submit(r, recs.back());
  }
  blocker->release();
  ASSERT_TRUE(blocker->wait());
  for (auto& r : recs) ASSERT_TRUE(r->wait());
  EXPECT_EQ(order, (std::vector<std::string>{"x", "i1", "i2", "q1", "q2", "q3"}));
}

TEST_F(SchedulerTest, ChunkedPrefillMatchesAnUnchunkedBudget) {
  const SequenceRequest r = sampled(prompt(45, 77), 12, 4);
  SchedulerOptions chunked = small_options();
  chunked.step_token_budget = 8;  // one chunk per step
  SchedulerOptions wide = small_options();
  wide.prefill_chunk = 64;
  wide.step_token_budget = 64;  // the whole prompt in one forward
  auto a = solo(r, chunked), b = solo(r, wide);
  EXPECT_EQ(a->tokens[0], b->tokens[0]);
  TextGenerator gen(*model_, *tokenizer_);
  EXPECT_EQ(a->tokens[0], gen.generate_ids({r.prompt}, gen_options(r)).front().tokens);
}

TEST_F(SchedulerTest, PrefixCacheReusesASharedSystemPrompt) {
  const auto system = prompt(32, 8);
  auto with_suffix = [&](uint64_t seed) {
    auto p = system;
    for (TokenId t : prompt(5, seed)) p.push_back(t);
    return p;
  };
  const SequenceRequest first = greedy(with_suffix(1), 10), second = sampled(with_suffix(2), 10, 3);
  Scheduler s(*model_, *tokenizer_, small_options());
  auto r1 = std::make_shared<Recorder>();
  s.submit(first, r1);
  ASSERT_TRUE(r1->wait());
  EXPECT_EQ(r1->cached_tokens, 0);
  const uint64_t hits0 = s.stats().prefix_cache_hit_tokens;
  EXPECT_GE(s.stats().prefix_cache_blocks, 4);
  auto r2 = std::make_shared<Recorder>();
  s.submit(second, r2);
  ASSERT_TRUE(r2->wait());
  EXPECT_EQ(r2->cached_tokens, 32);
  EXPECT_EQ(s.stats().prefix_cache_hit_tokens, hits0 + 32);
  EXPECT_EQ(r1->tokens[0], solo(first)->tokens[0]);
  EXPECT_EQ(r2->tokens[0], solo(second)->tokens[0]);
  // The whole prompt again: the last token is always computed, so 32 of 37 come from the cache.
  auto r3 = std::make_shared<Recorder>();
  s.submit(first, r3);
  ASSERT_TRUE(r3->wait());
  EXPECT_EQ(r3->cached_tokens, 32);
  EXPECT_EQ(r3->tokens[0], r1->tokens[0]);
}

// The prefix cache and n > 1 row sharing move the cache's bytes as stored, so with a quantized
// cache (this model's head_dim 16 fits the turbo types and the 16-bit ones) a hit and a shared
// row still give exactly the tokens of a solo run and of TextGenerator with the same cache type.
TEST_F(SchedulerTest, PrefixCacheAndSharedRowsWorkForQuantizedCaches) {
  const auto system = prompt(32, 8);
  auto with_suffix = [&](uint64_t seed) {
    auto p = system;
    for (TokenId t : prompt(5, seed)) p.push_back(t);
    return p;
  };
  for (model::KVCacheTypes types : {model::KVCacheTypes{model::KVCacheType::Turbo3, model::KVCacheType::Turbo4},
                                    model::KVCacheTypes{model::KVCacheType::BF16, model::KVCacheType::F16}}) {
    model_->set_kv_cache_types(types);
    const SequenceRequest first = greedy(with_suffix(1), 8);
    SequenceRequest second = sampled(with_suffix(2), 8, 3);
    second.n = 2;
    Scheduler s(*model_, *tokenizer_, small_options());
    auto r1 = std::make_shared<Recorder>();
    s.submit(first, r1);
    ASSERT_TRUE(r1->wait());
    auto r2 = std::make_shared<Recorder>(2);
    s.submit(second, r2);
    ASSERT_TRUE(r2->wait());
    EXPECT_EQ(r2->cached_tokens, 32);
    EXPECT_EQ(r1->tokens[0], solo(first)->tokens[0]);
    const auto alone = solo(second);
    EXPECT_EQ(r2->tokens, alone->tokens);
    TextGenerator gen(*model_, *tokenizer_);
    EXPECT_EQ(r1->tokens[0], gen.generate_ids({first.prompt}, gen_options(first)).front().tokens);
  }
  model_->set_kv_cache_types({});
}

TEST_F(SchedulerTest, PrefixCacheIsBoundedLeastRecentlyUsed) {
  SchedulerOptions o = small_options();
  o.prefix_cache_blocks = 3;
  Scheduler s(*model_, *tokenizer_, o);
  const auto a = prompt(30, 1), b = prompt(40, 2);  // 3 and 5 full blocks
  auto run = [&](const std::vector<TokenId>& p) {
    auto rec = std::make_shared<Recorder>();
    s.submit(greedy(p, 3), rec);
    EXPECT_TRUE(rec->wait());
    return rec;
  };
  run(a);
  EXPECT_EQ(s.stats().prefix_cache_blocks, 3);
  EXPECT_EQ(run(a)->cached_tokens, 24);
  run(b);  // evicts a's blocks; b's first three stay (a deeper block is useless without its parents)
  EXPECT_EQ(s.stats().prefix_cache_blocks, 3);
  EXPECT_EQ(run(b)->cached_tokens, 24);
  auto again = run(a);
  EXPECT_EQ(again->cached_tokens, 0);
  EXPECT_EQ(again->tokens[0], solo(greedy(a, 3))->tokens[0]);
}

TEST_F(SchedulerTest, PrefixBlocksOfACancelledPrefillAreKept) {
  SchedulerOptions o = small_options();
  o.step_token_budget = 8;
  Scheduler s(*model_, *tokenizer_, o);
  const auto long_prompt = prompt(50, 21);
  // Hold the loop in another request's first token while the long prompt is one chunk in.
  auto blocker = std::make_shared<Recorder>();
  blocker->block_first_token = true;
  auto victim = std::make_shared<Recorder>();
  s.submit(greedy(prompt(3, 5), 4), blocker);
  const RequestId v = s.submit(greedy(long_prompt, 4), victim);
  std::this_thread::sleep_for(50ms);
  blocker->release();
  // Let a few chunks run, then cancel before the prefill (7 chunks at one per step) ends.
  for (int i = 0; i < 200 && s.stats().prefix_cache_blocks < 2; ++i) std::this_thread::sleep_for(1ms);
  s.cancel(v);
  ASSERT_TRUE(victim->wait());
  ASSERT_TRUE(blocker->wait());
  const int64_t kept = s.stats().prefix_cache_blocks;
  EXPECT_GE(kept, 1);
  auto again = std::make_shared<Recorder>();
  s.submit(greedy(long_prompt, 4), again);
  ASSERT_TRUE(again->wait());
  EXPECT_GE(again->cached_tokens, 8);
  EXPECT_EQ(again->tokens[0], solo(greedy(long_prompt, 4))->tokens[0]);
}

TEST_F(SchedulerTest, NEqualsTwoSharesThePrompt) {
  SequenceRequest r = sampled(prompt(19, 6), 12, 40);
  r.n = 2;
  Scheduler s(*model_, *tokenizer_, small_options());
  auto rec = std::make_shared<Recorder>(2);
  s.submit(r, rec);
  ASSERT_TRUE(rec->wait());
  SequenceRequest one = r;
  one.n = 1;
  EXPECT_EQ(rec->tokens[0], solo(one)->tokens[0]);
  one.seed = r.seed + 1;
  EXPECT_EQ(rec->tokens[1], solo(one)->tokens[0]);
  EXPECT_NE(rec->tokens[0], rec->tokens[1]);
}

TEST_F(SchedulerTest, StopStringsAndMaxNewTokensAsTheGenerator) {
  TextGenerator gen(*model_, *tokenizer_);
  const auto p = tokenizer_->encode("the dog");
  SequenceRequest r = greedy(p, 40);
  const auto full = gen.generate_ids({p}, gen_options(r)).front();
  ASSERT_GE(full.text.size(), 8u);
  size_t start = full.text.size() / 3;
  while (start < full.text.size() && (static_cast<unsigned char>(full.text[start]) >> 6) == 0x2) ++start;
  size_t end = start + 1;
  while (end < full.text.size() && (static_cast<unsigned char>(full.text[end]) >> 6) == 0x2) ++end;
  r.stop = {"never \x01", full.text.substr(start, end - start)};
  const auto want = gen.generate_ids({p}, gen_options(r)).front();
  auto got = solo(r);
  EXPECT_EQ(got->reasons[0], "stop");
  EXPECT_EQ(got->texts[0], want.text);
  EXPECT_EQ(got->streamed[0], want.text);
  EXPECT_EQ(got->tokens[0], want.tokens);
  r.stop.clear();
  r.max_new_tokens = 7;
  got = solo(r);
  EXPECT_EQ(got->reasons[0], "length");
  EXPECT_EQ(got->tokens[0].size(), 7u);
  r.max_new_tokens = 0;
  got = solo(r);
  EXPECT_EQ(got->reasons[0], "length");
  EXPECT_TRUE(got->tokens[0].empty());
  // The slot's context caps max_new_tokens: 60 prompt tokens in 64 positions leave 4.
  got = solo(greedy(prompt(60, 9), 30));
  EXPECT_EQ(got->reasons[0], "length");
  EXPECT_EQ(got->tokens[0].size(), 4u);
}

TEST_F(SchedulerTest, QueueFullAndDraining) {
  SchedulerOptions o = small_options();
  o.slots = 1;
  o.max_queue = 1;
  Scheduler s(*model_, *tokenizer_, o);
  auto a = std::make_shared<Recorder>();
  a->block_first_token = true;
  s.submit(greedy(prompt(4, 1), 3), a);
  ASSERT_TRUE(a->wait_tokens(0));
  // Wait until the loop holds a (it is no longer queued), then fill the queue.
  for (int i = 0; i < 2000 && s.stats().queued != 0; ++i) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  auto b = std::make_shared<Recorder>();
  s.submit(greedy(prompt(4, 2), 3), b);
  EXPECT_THROW(s.submit(greedy(prompt(4, 3), 3), std::make_shared<Recorder>()), QueueFullError);
  a->release();
  EXPECT_TRUE(s.drain(std::chrono::steady_clock::now() + 20s));
  EXPECT_EQ(b->reasons[0], "length");
  EXPECT_THROW(s.submit(greedy(prompt(4, 3), 3), std::make_shared<Recorder>()), DrainingError);
}

TEST_F(SchedulerTest, DrainPastTheDeadlineCancels) {
  Scheduler s(*model_, *tokenizer_, small_options());
  auto a = std::make_shared<Recorder>();
  a->block_first_token = true;
  s.submit(greedy(prompt(4, 1), 30), a);
  std::thread releaser([&] {
    std::this_thread::sleep_for(100ms);
    a->release();
  });
  EXPECT_FALSE(s.drain(std::chrono::steady_clock::now() + 20ms));
  releaser.join();
  EXPECT_EQ(a->reasons[0], "cancelled");
}

TEST_F(SchedulerTest, LogprobsAreTheLogSoftmaxOfTheLogits) {
  SequenceRequest r = sampled(prompt(9, 31), 8, 2);
  r.top_logprobs = 5;
  r.logit_bias = {{7, 1.5f}};
  auto rec = solo(r);
  ASSERT_EQ(rec->logprobs[0].size(), 8u);
  // Independently: full forward over prompt + generated, bias added, log-softmax in double.
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> seq(r.prompt.begin(), r.prompt.end());
  for (TokenId t : rec->tokens[0]) seq.push_back(t);
  const int64_t T = static_cast<int64_t>(seq.size()), V = model_->config().vocab_size;
  Tensor logits = model_->forward(Tensor::from_vector(seq, {1, T})).contiguous();
  for (size_t k = 0; k < 8; ++k) {
    const float* row = logits.data<float>() + (static_cast<int64_t>(r.prompt.size()) - 1 + static_cast<int64_t>(k)) * V;
    std::vector<double> x(row, row + V);
    x[7] += 1.5;
    double m = *std::max_element(x.begin(), x.end()), sum = 0;
    for (double v : x) sum += std::exp(v - m);
    const double lse = m + std::log(sum);
    const TokenId chosen = rec->tokens[0][k];
    EXPECT_EQ(rec->logprobs[0][k].token, chosen);
    EXPECT_NEAR(rec->logprobs[0][k].logprob, x[chosen] - lse, 1e-4);
    const auto& top = rec->tops[0][k];
    ASSERT_EQ(top.size(), 5u);
    std::vector<int64_t> order(V);
    for (int64_t i = 0; i < V; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(top[j].token, order[j]) << "step " << k << " rank " << j;
      EXPECT_NEAR(top[j].logprob, x[order[j]] - lse, 1e-4);
    }
  }
}

TEST_F(SchedulerTest, LogitBiasForcesAToken) {
  for (bool samp : {false, true}) {
    SequenceRequest r = samp ? sampled(prompt(6, 2), 6, 3) : greedy(prompt(6, 2), 6);
    r.logit_bias = {{123, 100.0f}};
    auto rec = solo(r);
    EXPECT_EQ(rec->tokens[0], std::vector<TokenId>(6, 123));
    r.logit_bias = {{123, -1e30f}};
    rec = solo(r);
    for (TokenId t : rec->tokens[0]) EXPECT_NE(t, 123);
  }
}

TEST_F(SchedulerTest, PresenceAndFrequencyPenaltiesDiscourageRepeats) {
  SequenceRequest r = greedy(prompt(4, 17), 30);
  auto base = solo(r);
  std::set<TokenId> distinct(base->tokens[0].begin(), base->tokens[0].end());
  ASSERT_LT(distinct.size(), 30u) << "greedy decoding of the random model repeats tokens (the baseline)";
  for (int which = 0; which < 2; ++which) {
    SequenceRequest p = r;
    (which == 0 ? p.presence_penalty : p.frequency_penalty) = 1000.0f;
    auto rec = solo(p);
    std::set<TokenId> d(rec->tokens[0].begin(), rec->tokens[0].end());
    EXPECT_EQ(d.size(), 30u) << (which == 0 ? "presence" : "frequency");
    EXPECT_EQ(rec->tokens[0][0], base->tokens[0][0]) << "the first token has nothing to penalise";
  }
  // A small penalty still changes the greedy path once a token repeats.
  SequenceRequest f = r;
  f.frequency_penalty = 0.5f;
  EXPECT_NE(solo(f)->tokens[0], base->tokens[0]);
}

TEST_F(SchedulerTest, FastPathRequestsEqualSoloRuns) {
  model::Decoder d(model_->config());
  for (const auto& [name, t] : model_->named_parameters()) d.load_parameter(name, t);
  d.prepare_inference();
  TextGenerator gen(d, *tokenizer_);
  // Mixed greedy and sampled rows (logits for every row), then greedy only (the fused argmax).
  for (bool all_greedy : {false, true}) {
    Scheduler s(d, *tokenizer_, small_options());
    std::vector<SequenceRequest> reqs;
    std::vector<std::shared_ptr<Recorder>> got;
    for (int i = 0; i < 8; ++i) {
      reqs.push_back(i % 2 && !all_greedy ? sampled(prompt(3 + 5 * i, 60 + i), 12, 7 + i) : greedy(prompt(3 + 5 * i, 60 + i), 12));
      got.push_back(std::make_shared<Recorder>());
      s.submit(reqs.back(), got.back());
    }
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(got[i]->wait());
      EXPECT_EQ(got[i]->tokens[0], gen.generate_ids({reqs[i].prompt}, gen_options(reqs[i])).front().tokens) << i;
    }
  }
}

TEST_F(SchedulerTest, GrammarConstrainsTheOutput) {
  const std::vector<std::string> choices = {"the cat sat", "a dog ran on the mat", "naïve café"};
  for (bool samp : {false, true}) {
    SequenceRequest r = samp ? sampled(prompt(7, 12), 30, 8) : greedy(prompt(7, 12), 30);
    r.stop_at_eos = true;
    r.grammar = Grammar::choices(choices);
    r.n = 2;
    Scheduler s(*model_, *tokenizer_, small_options());
    auto rec = std::make_shared<Recorder>(2);
    s.submit(r, rec);
    ASSERT_TRUE(rec->wait());
    ASSERT_TRUE(rec->error.empty()) << rec->error;
    for (int i = 0; i < 2; ++i) {
      EXPECT_NE(std::find(choices.begin(), choices.end(), rec->texts[i]), choices.end()) << "'" << rec->texts[i] << "'";
      EXPECT_EQ(rec->reasons[i], "stop");
      EXPECT_EQ(rec->streamed[i], rec->texts[i]);
    }
  }
  // A regex under a short budget: forcing still completes it.
  SequenceRequest r = sampled(prompt(5, 13), 6, 9);
  r.grammar = Grammar::regex("[a-z]+ (cat|dog)");
  auto rec = solo(r);
  ASSERT_TRUE(rec->error.empty()) << rec->error;
  EXPECT_LE(rec->tokens[0].size(), 6u);
  const std::string& t = rec->texts[0];
  const size_t sp = t.find(' ');
  ASSERT_NE(sp, std::string::npos) << t;
  EXPECT_TRUE(t.substr(sp) == " cat" || t.substr(sp) == " dog") << t;
}

// A grammar that fails: in start() (at admission) or after `budget` bytes (mid-decode).
class FailingGrammar : public Grammar {
 public:
  FailingGrammar(bool in_start, int budget) : in_start_(in_start), budget_(budget) {}
  std::unique_ptr<GrammarState> start() const override {
    if (in_start_) throw std::runtime_error("grammar start failed");
    return std::make_unique<State>(budget_);
  }
  std::string describe() const override { return "failing"; }

 private:
  struct State : GrammarState {
    explicit State(int n) : left(n) {}
    std::unique_ptr<GrammarState> clone() const override { return std::make_unique<State>(left); }
    bool advance(std::string_view bytes) override {
      left -= static_cast<int>(bytes.size());
      if (left < 0) throw std::runtime_error("grammar state failed");
      return true;
    }
    bool accepts() const override { return false; }
    bool can_continue() const override { return true; }
    int64_t min_bytes_to_accept() const override { return 1; }
    void next_bytes(bool out[256]) const override { std::fill(out, out + 256, true); }
    int left;
  };
  bool in_start_;
  int budget_;
};

TEST_F(SchedulerTest, ARequestThatFailsGetsOnErrorAndOthersGoOn) {
  Scheduler s(*model_, *tokenizer_, small_options());
  const SequenceRequest ok = greedy(prompt(6, 4), 10);
  for (bool in_start : {true, false}) {
    SequenceRequest bad = greedy(prompt(5, 3), 10);
    bad.grammar = std::make_shared<FailingGrammar>(in_start, 4);
    bad.n = 2;
    auto b = std::make_shared<Recorder>(2);
    auto g = std::make_shared<Recorder>();
    s.submit(ok, g);
    s.submit(bad, b);
    ASSERT_TRUE(b->wait());
    ASSERT_TRUE(g->wait());
    EXPECT_NE(b->error.find("grammar"), std::string::npos) << b->error;
    EXPECT_EQ(b->finished, 0) << "no on_finished after on_error";
    EXPECT_EQ(g->tokens[0], solo(ok)->tokens[0]);
    EXPECT_EQ(g->reasons[0], "length");
  }
  ASSERT_TRUE(s.drain(std::chrono::steady_clock::now() + 10s));
  EXPECT_EQ(s.stats().slots_busy, 0);
}

TEST_F(SchedulerTest, RowsSampledOnSeveralThreadsEqualSoloRuns) {
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(sampled(prompt(4 + i, 200 + i), 10, 50 + i));
    if (i % 3 == 1) reqs.back().top_logprobs = 3;
    if (i % 3 == 2) reqs.back().frequency_penalty = 0.7f;
  }
  std::vector<std::shared_ptr<Recorder>> want;
  for (const auto& r : reqs) want.push_back(solo(r));
  const int before = num_threads();
  set_num_threads(3);
  {
    SchedulerOptions o = small_options();
    o.slots = 6;
    o.step_token_budget = 64;
    Scheduler s(*model_, *tokenizer_, o);
    std::vector<std::shared_ptr<Recorder>> got;
    for (const auto& r : reqs) {
      got.push_back(std::make_shared<Recorder>());
      s.submit(r, got.back());
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(got[i]->wait());
      EXPECT_EQ(got[i]->tokens[0], want[i]->tokens[0]) << "request " << i;
      ASSERT_EQ(got[i]->logprobs[0].size(), want[i]->logprobs[0].size());
      for (size_t k = 0; k < got[i]->logprobs[0].size(); ++k)
        EXPECT_EQ(got[i]->logprobs[0][k].logprob, want[i]->logprobs[0][k].logprob);
    }
  }
  set_num_threads(before);
}

TEST_F(SchedulerTest, ObserverExceptionsDoNotStopOthers) {
  struct Thrower : Recorder {
    void on_token(int, TokenId, const std::string&, const TokenLogprob*, const std::vector<TokenLogprob>*) override {
      throw std::runtime_error("observer bug");
    }
  };
  Scheduler s(*model_, *tokenizer_, small_options());
  auto bad = std::make_shared<Thrower>();
  auto good = std::make_shared<Recorder>();
  s.submit(greedy(prompt(5, 1), 5), bad);
  s.submit(greedy(prompt(5, 2), 5), good);
  ASSERT_TRUE(good->wait());
  ASSERT_TRUE(bad->wait());
  EXPECT_EQ(good->tokens[0].size(), 5u);
}

TEST_F(SchedulerTest, BadRequestsAndOptionsAreValueErrors) {
  Scheduler s(*model_, *tokenizer_, small_options());
  auto obs = std::make_shared<Recorder>();
  auto expect_error = [&](SequenceRequest r, const std::string& field) {
    try {
      s.submit(std::move(r), obs);
      ADD_FAILURE() << "no error for " << field;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  const SequenceRequest ok = greedy(prompt(4, 1), 4);
  SequenceRequest r = ok;
  r.prompt.clear();
  expect_error(r, "prompt");
  r = ok;
  r.prompt = prompt(64, 1);
  expect_error(r, "prompt");
  r = ok;
  r.prompt[1] = 100000;
  expect_error(r, "prompt");
  r = ok;
  r.n = 0;
  expect_error(r, "n must");
  r.n = 5;
  expect_error(r, "n must");
  r = ok;
  r.top_logprobs = 21;
  expect_error(r, "top_logprobs");
  r = ok;
  r.logit_bias = {{5000, 1.0f}};
  expect_error(r, "logit_bias");
  r = ok;
  r.max_new_tokens = -1;
  expect_error(r, "max_new_tokens");
  r = ok;
  r.sampling.top_p = 0;
  expect_error(r, "top_p");
  r = ok;
  r.stop = {""};
  expect_error(r, "stop");
  r = ok;
  r.eos_ids = {-3};
  expect_error(r, "eos_ids");
  SchedulerOptions o = small_options();
  o.step_token_budget = 4;
  EXPECT_THROW(Scheduler(*model_, *tokenizer_, o), ValueError);
  o = small_options();
  o.slots = 0;
  EXPECT_THROW(Scheduler(*model_, *tokenizer_, o), ValueError);
  o = small_options();
  o.context = 65;
  EXPECT_THROW(Scheduler(*model_, *tokenizer_, o), ValueError);
}

// A vocabulary of `n` one-byte tokens: lets the throughput run use the `tiny` shape's full
// 16,384-entry LM head (the sampler and the fused argmax stop at the tokenizer's vocabulary).
class WideTokenizer : public Tokenizer {
 public:
  explicit WideTokenizer(size_t n) : n_(n) {}
  std::vector<TokenId> encode(std::string_view, const EncodeOptions&) const override { return {}; }
  void encode_append(std::string_view, const EncodeOptions&, std::vector<TokenId>&) const override {}
  std::string decode(std::span<const TokenId> ids, bool) const override { return std::string(ids.size(), 'a'); }
  std::string_view token_bytes(TokenId) const override { return "a"; }
  bool is_special(TokenId) const override { return false; }
  size_t vocab_size() const override { return n_; }
  std::optional<TokenId> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string describe() const override { return "wide test vocabulary"; }

 private:
  size_t n_;
};

// Throughput figure, not a test of speed: 64 concurrent greedy requests (16-token prompts) of 64
// new tokens on a `tiny`-shaped random model (bf16 fast path), 64 slots. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'.
TEST(SchedulerBench, DISABLED_ThroughputTinyShape) {
  model::ModelConfig c = model::ModelConfig::preset("tiny");
  model::Decoder d(c);
  d.init_weights(5);
  d.prepare_inference();
  WideTokenizer tok(static_cast<size_t>(c.vocab_size));
  {
    // The yardstick: the same 64 prompts as one TextGenerator batch (no arrivals, no scheduling).
    std::vector<std::vector<TokenId>> prompts;
    for (int i = 0; i < 64; ++i) {
      prompts.emplace_back();
      for (int64_t id : testing::random_ids(16, c.vocab_size, 900 + i)) prompts.back().push_back(static_cast<TokenId>(id));
    }
    TextGenerator gen(d, tok);
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = gen.generate_ids(prompts, testing::greedy_options(64));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "[ generator ] the same 64 prompts as one batch: " << 64 * 64 / secs << " generated tok/s (decode only "
              << out[0].decode_tok_s << ")\n";
  }
  struct Load {
    int64_t slots;
    float temperature, top_p;
  };
  for (auto [slots, temperature, top_p] : {Load{64, 0.0f, 1.0f}, Load{16, 0.0f, 1.0f}, Load{64, 1.0f, 1.0f}, Load{64, 0.8f, 0.95f}}) {
    SchedulerOptions o;
    o.slots = slots;
    o.context = 512;
    Scheduler s(d, tok, o);
    std::vector<std::shared_ptr<Recorder>> got;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 64; ++i) {
      SequenceRequest r;
      for (int64_t id : testing::random_ids(16, c.vocab_size, 900 + i)) r.prompt.push_back(static_cast<TokenId>(id));
      r.max_new_tokens = 64;
      r.sampling.temperature = temperature;  // 0: greedy
      r.sampling.top_p = top_p;
      r.seed = static_cast<uint64_t>(i);
      r.stop_at_eos = false;
      got.push_back(std::make_shared<Recorder>());
      s.submit(r, got.back());
    }
    int64_t tokens = 0;
    for (auto& g : got) {
      ASSERT_TRUE(g->wait(600s));
      tokens += static_cast<int64_t>(g->tokens[0].size());
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "[ scheduler ] 64 requests x 64 tokens (16-token prompts), tiny shape bf16, "
              << (temperature > 0 ? "temperature " + std::to_string(temperature) + " top_p " + std::to_string(top_p) + ", " : std::string("greedy, ")) << slots
              << " slots: " << tokens << " tokens in " << secs << " s = " << tokens / secs << " generated tok/s ("
              << s.stats().steps << " steps)\n";
  }
}

}  // namespace
}  // namespace corelm::infer
