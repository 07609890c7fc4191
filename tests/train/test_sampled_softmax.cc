// Sampled softmax for training: the unigram proposal with its count floor, the seeded candidate
// draws (reproducible, resumable), the trainer's loss options and their bad-input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>

#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/train.h"
#include "train/sampled_softmax.h"

namespace corelm::train {
namespace {
namespace fs = std::filesystem;

TEST(UnigramProposal, FloorAndAlphaShapeTheProbabilities) {
  const std::vector<int64_t> counts = {0, 1, 100, 32, 5};
  const UnigramProposal q(counts, 32, 1.0);
  const std::vector<double> expected = {32, 32, 100, 32, 32};  // every count below 32 lifted to 32
  const double total = std::accumulate(expected.begin(), expected.end(), 0.0);
  for (size_t v = 0; v < counts.size(); ++v) EXPECT_NEAR(q.prob(v), expected[v] / total, 1e-12) << v;
  EXPECT_NEAR(std::accumulate(q.probs().begin(), q.probs().end(), 0.0), 1.0, 1e-12);

  const UnigramProposal flat(counts, 0, 0.75);
  EXPECT_EQ(flat.prob(0), 0.0);  // no floor: an unseen id has no mass
  EXPECT_NEAR(flat.prob(2) / flat.prob(4), std::pow(100.0 / 5.0, 0.75), 1e-9);
  EXPECT_NEAR(std::accumulate(flat.probs().begin(), flat.probs().end(), 0.0), 1.0, 1e-12);
}

TEST(UnigramProposal, DrawsFollowTheProbabilities) {
  const UnigramProposal q({0, 10, 30, 60}, 0, 1.0);
  Generator gen(7);
  std::vector<int64_t> hits(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++hits[q.draw(gen)];
  EXPECT_EQ(hits[0], 0);  // zero probability is never drawn
  for (int v = 1; v < 4; ++v) {
    const double p = q.prob(v), sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(hits[v], n * p, 5 * sd) << v;
  }
}

TEST(DrawCandidates, ReproducibleSortedAndHoldingEveryTarget) {
  std::vector<int64_t> counts(500);
  for (size_t v = 0; v < counts.size(); ++v) counts[v] = static_cast<int64_t>(1000 / (v + 1));
  const UnigramProposal q(counts, 32, 1.0);
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{499, 3, -100, 250, 3}, {5});
  const CandidateSet a = draw_candidates(q, 64, targets, 42, 10, 0);
  const CandidateSet b = draw_candidates(q, 64, targets, 42, 10, 0);
  EXPECT_EQ(a.candidates.to_int_vector(), b.candidates.to_int_vector());
  EXPECT_EQ(a.log_correction.to_float_vector(), b.log_correction.to_float_vector());
  // another step, micro-batch or seed draws other negatives
  EXPECT_NE(draw_candidates(q, 64, targets, 42, 11, 0).candidates.to_int_vector(), a.candidates.to_int_vector());
  EXPECT_NE(draw_candidates(q, 64, targets, 42, 10, 1).candidates.to_int_vector(), a.candidates.to_int_vector());
  EXPECT_NE(draw_candidates(q, 64, targets, 43, 10, 0).candidates.to_int_vector(), a.candidates.to_int_vector());

  const std::vector<int64_t> c = a.candidates.to_int_vector();
  const std::vector<float> corr = a.log_correction.to_float_vector();
  for (size_t j = 1; j < c.size(); ++j) EXPECT_LT(c[j - 1], c[j]);
  for (int64_t t : {499, 3, 250}) EXPECT_TRUE(std::binary_search(c.begin(), c.end(), t)) << t;
  EXPECT_GT(a.sampled, 20);
  EXPECT_LE(a.sampled, 64);
  EXPECT_LE(static_cast<int64_t>(c.size()), a.sampled + 3);
  for (size_t j = 0; j < c.size(); ++j) {
    const double p = q.prob(c[j]);
    EXPECT_NEAR(corr[j], std::log(1 - std::pow(1 - p, 64)), 1e-5) << c[j];
    EXPECT_LE(corr[j], 0.0f);
  }
}

TEST(SampledSoftmaxErrors, BadSettingsAreClearErrors) {
  const std::vector<int64_t> counts = {3, 4, 5};
  EXPECT_THROW(UnigramProposal(counts, -1, 1.0), ValueError);
  EXPECT_THROW(UnigramProposal(counts, 32, 0.0), ValueError);
  EXPECT_THROW(UnigramProposal({}, 32, 1.0), ValueError);
  EXPECT_THROW(UnigramProposal({0, 0}, 0, 1.0), ValueError);
  const UnigramProposal q(counts, 1, 1.0);
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{1}, {1});
  try {
    draw_candidates(q, 4, t, 0, 0, 0);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("negatives must be in [1, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(draw_candidates(q, 0, t, 0, 0, 0), ValueError);
  EXPECT_THROW(draw_candidates(q, 2, Tensor::from_vector(std::vector<int64_t>{7}, {1}), 0, 0, 0), ValueError);
}

// ---- the trainer's loss options ----

model::ModelConfig small_config() {
  model::ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.max_position_embeddings = 32;
  return c;
}

// A repeating phrase with noise: learnable in a few dozen steps.
std::vector<TokenId> phrase_tokens(int64_t n) {
  Generator g(3);
  std::vector<TokenId> ids;
  while (static_cast<int64_t>(ids.size()) < n) {
    for (TokenId t = 10; t <= 120; t += 10) ids.push_back(t);
    ids.push_back(static_cast<TokenId>(130 + g.below(8)));
  }
  ids.resize(n);
  return ids;
}

struct TinyRun {
  fs::path dir;
  TokenDataset data = TokenDataset::from_ids(phrase_tokens(3000));
  Split split = split_tokens(data.size(), 0.1, 16);
  std::vector<Batch> val = sequential_batches(data, split.train_end, data.size(), 4, 16, 2);

  explicit TinyRun(const std::string& name)
      : dir(fs::temp_directory_path() / ("corelm_sampled_test_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(dir);
  }
  ~TinyRun() { fs::remove_all(dir); }

  TrainOptions options(int64_t steps) const {
    TrainOptions o;
    o.out_dir = dir.string();
    o.steps = steps;
    o.batch = 4;
    o.seq = 16;
    o.schedule.lr = 1e-2;
    o.schedule.warmup = 0;
    o.sample_tokens = 0;
    o.progress = false;
    o.seed = 9;
    o.loss = "sampled";
    o.sampled_negatives = 24;
    o.unigram_counts = count_tokens(data, 0, split.train_end, 256);
    return o;
  }
  TrainResult train_model(model::Decoder& m, const TrainOptions& o, uint64_t sampler_seed = 5) {
    WindowSampler s(data, 0, split.train_end, sampler_seed);
    return train(m, s, &val, nullptr, "", o);
  }
};

model::Decoder fresh(uint64_t seed) {
  model::Decoder m(small_config());
  m.init_weights(seed);
  return m;
}

TEST(TrainerLoss, UnknownLossAndMissingCountsAreClearErrors) {
  TinyRun run("errors");
  model::Decoder m = fresh(1);
  TrainOptions o = run.options(2);
  o.loss = "hierarchical";
  try {
    run.train_model(m, o);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown loss 'hierarchical'"), std::string::npos) << e.what();
  }
  o = run.options(2);
  o.unigram_counts.clear();
  EXPECT_THROW(run.train_model(m, o), ValueError);
  o = run.options(2);
  o.sampled_negatives = 257;
  EXPECT_THROW(run.train_model(m, o), ValueError);
  o = run.options(2);
  o.sampled_floor = -1;
  EXPECT_THROW(run.train_model(m, o), ValueError);
  o = run.options(2);
  o.compute_dtype = "fp8";
  EXPECT_THROW(run.train_model(m, o), ValueError);
}

TEST(TrainerLoss, SampledRunResumesBitIdentically) {
  TinyRun straight_run("straight"), resumed_run("resumed");
  model::Decoder straight = fresh(4);
  straight_run.train_model(straight, straight_run.options(6));

  model::Decoder first = fresh(4);
  TrainOptions o = resumed_run.options(6);
  o.stop_at = 3;
  resumed_run.train_model(first, o);
  model::Decoder second = fresh(77);  // overwritten by the checkpoint
  o.stop_at = 0;
  o.resume = true;
  o.seed = 555;  // the draws keep the checkpoint's seed
  EXPECT_EQ(resumed_run.train_model(second, o, 1234).end_step, 6);
  for (size_t i = 0; i < straight.parameters().size(); ++i)
    EXPECT_EQ(straight.parameters()[i].to_float_vector(), second.parameters()[i].to_float_vector()) << i;
}

// The sampled loss trains the model: the FULL-softmax validation loss falls well below its start.
TEST(TrainerLoss, SampledLossLowersTheFullValidationLoss) {
  TinyRun run("learn");
  model::Decoder m = fresh(2);
  const double before = evaluate(m, run.val).mean_loss;
  const TrainResult r = run.train_model(m, run.options(40));
  ASSERT_TRUE(r.last_val_loss.has_value());
  EXPECT_LT(*r.last_val_loss, before - 1.5) << before << " -> " << *r.last_val_loss;
}

}  // namespace
}  // namespace corelm::train
