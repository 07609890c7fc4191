// Batch invariance of the fast inference path: a row's logits and greedy tokens are bitwise
// identical whether it runs alone or in a batch of 16, wherever it sits in the batch, whatever
// the other rows hold (other prompts, other cache lengths, rows leaving the batch between steps)
// and with 1 or 2 threads -- on every ISA path this CPU supports, for the bf16 and q4 packings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "corelm/isa.h"
#include "corelm/model.h"
#include "corelm/thread_pool.h"

namespace corelm::model {
namespace {

ModelConfig config() {
  ModelConfig c;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 384;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 128;
  c.initializer_range = 0.08;
  return c;
}

int64_t next_id(uint64_t& s, int64_t vocab) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<int64_t>(s >> 33) % vocab;
}

constexpr int64_t kPromptLen = 11, kSteps = 6, kBatch = 16;

// Every logit the target row produced (prefill, then each greedy decode step), in order.
struct Trace {
  std::vector<float> logits;
  std::vector<int64_t> tokens;
};

// Runs the target prompt in cache row `slot` of a batch of `batch` rows. The other rows get
// their own prompts, first a history of different lengths, and some of them leave the batch
// during decoding (as finished rows do in the generator).
Trace run_target(const Decoder& d, int64_t batch, int64_t slot, uint64_t others_seed) {
  const int64_t V = d.config().vocab_size;
  KVCache cache(d.config(), batch, 64);
  uint64_t s = others_seed;
  for (int64_t r = 0; r < batch; ++r) {
    if (r == slot) continue;
    const int64_t history = 1 + next_id(s, 20);
    std::vector<int64_t> ids(static_cast<size_t>(history));
    for (auto& id : ids) id = next_id(s, V);
    d.forward_cached(Tensor::from_vector(ids, {1, history}), cache, {r}, Logits::None);
  }
  std::vector<int64_t> rows(static_cast<size_t>(batch)), ids;
  for (int64_t r = 0; r < batch; ++r) rows[r] = r;
  uint64_t target_seed = 42;
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t t = 0; t < kPromptLen; ++t) ids.push_back(r == slot ? next_id(target_seed, V) : next_id(s, V));
  Trace trace;
  auto take = [&](const Tensor& logits, int64_t index_in_batch, int64_t T, int64_t t) {
    const float* p = logits.data<float>() + (index_in_batch * T + t) * V;
    trace.logits.insert(trace.logits.end(), p, p + V);
  };
  Tensor logits = d.forward_cached(Tensor::from_vector(ids, {batch, kPromptLen}), cache, rows).contiguous();
  for (int64_t t = 0; t < kPromptLen; ++t) take(logits, slot, kPromptLen, t);
  std::vector<int64_t> last(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) {
    const float* p = logits.data<float>() + (r * kPromptLen + kPromptLen - 1) * V;
    last[r] = std::max_element(p, p + V) - p;
  }
  for (int64_t step = 0; step < kSteps; ++step) {
    trace.tokens.push_back(last[slot]);
    std::vector<int64_t> live, step_ids;
    for (int64_t r = 0; r < batch; ++r)
      if (r == slot || (r + step) % 5 != 0) {  // some other rows drop out at each step
        live.push_back(r);
        step_ids.push_back(last[r]);
      }
    const int64_t B = static_cast<int64_t>(live.size());
    logits = d.forward_cached(Tensor::from_vector(step_ids, {B, 1}), cache, live).contiguous();
    for (int64_t b = 0; b < B; ++b) {
      const float* p = logits.data<float>() + b * V;
      last[live[b]] = std::max_element(p, p + V) - p;
      if (live[b] == slot) take(logits, b, 1, 0);
    }
  }
  return trace;
}

class BatchInvariance : public ::testing::TestWithParam<std::tuple<Isa, Precision>> {
 protected:
  void SetUp() override { scoped_ = std::make_unique<ScopedIsa>(std::get<0>(GetParam())); }
  void TearDown() override {
    set_num_threads(1);
    scoped_.reset();
  }
  std::unique_ptr<ScopedIsa> scoped_;
};

TEST_P(BatchInvariance, RowOutputsAreBitwiseIdenticalWhateverTheBatch) {
  Decoder d(config());
  d.init_weights(2024);
  d.prepare_inference(std::get<1>(GetParam()));
  const Trace alone = run_target(d, 1, 0, 0);
  ASSERT_EQ(alone.logits.size(), static_cast<size_t>((kPromptLen + kSteps) * d.config().vocab_size));
  struct Case {
    int64_t slot;
    uint64_t others;
    int threads;
  };
  for (Case c : {Case{0, 1, 1}, Case{7, 2, 1}, Case{15, 3, 1}, Case{7, 4, 1}, Case{9, 5, 2}}) {
    set_num_threads(c.threads);
    const Trace batched = run_target(d, kBatch, c.slot, c.others);
    set_num_threads(1);
    ASSERT_EQ(batched.logits.size(), alone.logits.size());
    EXPECT_EQ(0, std::memcmp(batched.logits.data(), alone.logits.data(), alone.logits.size() * sizeof(float)))
        << "slot " << c.slot << ", other rows seed " << c.others << ", " << c.threads << " threads";
    EXPECT_EQ(batched.tokens, alone.tokens) << "slot " << c.slot;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, BatchInvariance,
                         ::testing::Combine(::testing::ValuesIn(supported_isas()),
                                            ::testing::Values(Precision::BF16, Precision::Q4)),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, Precision>>& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  precision_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace corelm::model
