// Trainer: schedules, data sampling, SFT masking, checkpoints, exact resume, and learning.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "corelm/model.h"
#include "common/model_factories.h"
#include "corelm/model_dir.h"
#include "corelm/safetensors.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"
#include "corelm/train.h"

namespace corelm::train {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("corelm_train_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// A small byte-level BPE trained on a few sentences: enough for SFT and checkpoint tests.
std::string make_tokenizer(const fs::path& dir) {
  const fs::path text = dir / "tok_corpus.txt";
  std::string corpus;
  for (int i = 0; i < 50; ++i) corpus += "the cat sat on the mat. question: what is two plus two? answer: four.\n";
  write_text(text, corpus);
  BpeTrainOptions o;
  o.vocab_size = 300;
  const std::string out = (dir / "tokenizer.json").string();
  train_bpe({text.string()}, o, out);
  return out;
}

model::ModelConfig small_config(int64_t vocab = 256) {
  return corelm::testing::tiny_decoder_config(vocab, model::ModelConfig{}.initializer_range);
}

// A repetitive token stream with some noise: learnable in a few steps.
std::vector<TokenId> pattern_tokens(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<TokenId> ids;
  const std::vector<TokenId> phrase = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120};
  while (static_cast<int64_t>(ids.size()) < n) {
    for (TokenId t : phrase) ids.push_back(t);
    ids.push_back(static_cast<TokenId>(130 + g.below(8)));
  }
  ids.resize(n);
  return ids;
}

// ---- schedules ----

TEST(Schedule, ConstantCosineWsd) {
  Schedule s;
  s.lr = 1.0;
  s.warmup = 10;
  s.total = 110;
  s.min_lr_ratio = 0.1;
  s.kind = ScheduleKind::kConstant;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(50), 1.0);
  s.kind = ScheduleKind::kCosine;
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway: min + (max - min) / 2
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_GT(s.at(30), s.at(31));
  s.kind = ScheduleKind::kWsd;
  s.decay_fraction = 0.2;  // last 22 steps decay
  EXPECT_DOUBLE_EQ(s.at(87), 1.0);
  EXPECT_LT(s.at(88), 1.0);
  EXPECT_NEAR(s.at(109), 0.1, 1e-12);
  EXPECT_EQ(parse_schedule("wsd"), ScheduleKind::kWsd);
  EXPECT_THROW(parse_schedule("linear"), ValueError);
}

// ---- data ----

TEST(Data, SamplerIsDeterministicBySeedAndResumable) {
  TokenDataset d = TokenDataset::from_ids(pattern_tokens(1000, 1));
  WindowSampler a(d, 0, 900, 7), b(d, 0, 900, 7), c(d, 0, 900, 8);
  Batch ba = a.next(4, 16), bb = b.next(4, 16), bc = c.next(4, 16);
  EXPECT_EQ(ba.ids.to_int_vector(), bb.ids.to_int_vector());
  EXPECT_NE(ba.ids.to_int_vector(), bc.ids.to_int_vector());
  // targets are the ids shifted by one, and windows stay inside [0, 900)
  auto ids = ba.ids.to_int_vector(), tg = ba.targets.to_int_vector();
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t + 1 < 16; ++t) EXPECT_EQ(tg[r * 16 + t], ids[r * 16 + t + 1]);
  // state round trip
  WindowSampler resumed(d, 0, 900, 0);
  resumed.set_state(a.state());
  EXPECT_EQ(a.next(4, 16).ids.to_int_vector(), resumed.next(4, 16).ids.to_int_vector());
  EXPECT_EQ(a.drawn(), 8);
  WindowSampler tiny(d, 0, 10, 0);
  EXPECT_THROW(tiny.next(1, 16), ValueError);
}

TEST(Data, SequentialBatchesCoverEveryTargetOnce) {
  std::vector<TokenId> ids(103);
  for (int i = 0; i < 103; ++i) ids[i] = i;
  TokenDataset d = TokenDataset::from_ids(ids);
  auto batches = sequential_batches(d, 3, 103, 3, 8);
  std::vector<int> seen(103, 0);
  for (const Batch& b : batches)
    for (int64_t t : b.targets.to_int_vector())
      if (t != -100) seen[t]++;
  for (int i = 0; i < 103; ++i) EXPECT_EQ(seen[i], i >= 4 ? 1 : 0) << i;
  Split s = split_tokens(1000, 0.1, 16);
  EXPECT_EQ(s.train_end, 900);
  EXPECT_THROW(split_tokens(20, 0.5, 16), ValueError);
}

TEST(Data, TokenFileIsMemoryMapped) {
  fs::path dir = temp_dir("tokfile");
  std::vector<uint16_t> raw = {1, 2, 3, 65535, 7};
  std::ofstream((dir / "t.bin").string(), std::ios::binary)
      .write(reinterpret_cast<const char*>(raw.data()), raw.size() * 2);
  write_text(dir / "t.bin.json", R"({"dtype": "uint16", "tokens": 5, "vocab_size": 65536})");
  TokenDataset d = TokenDataset::open((dir / "t.bin").string());
  ASSERT_EQ(d.size(), 5);
  EXPECT_EQ(d[3], 65535);
  EXPECT_EQ(d.vocab_bound(), 65536);
  write_text(dir / "t.bin.json", R"({"dtype": "uint16", "tokens": 6})");
  EXPECT_THROW(TokenDataset::open((dir / "t.bin").string()), FormatError);
  write_text(dir / "t.bin.json", R"({"dtype": "int8"})");
  EXPECT_THROW(TokenDataset::open((dir / "t.bin").string()), FormatError);
  EXPECT_THROW(TokenDataset::open((dir / "missing.bin").string()), IOError);
  fs::remove_all(dir);
}

// ---- SFT ----

TEST(Sft, LossOnlyOnOutputTokens) {
  fs::path dir = temp_dir("sft");
  auto tok = Tokenizer::load(make_tokenizer(dir));
  write_text(dir / "pairs.jsonl", "{\"input\": \"question: what is two plus two?\", \"output\": \" answer: four.\"}\n\n"
                                  "{\"input\": \"the cat\", \"output\": \" sat\"}\n");
  auto pairs = load_sft_pairs((dir / "pairs.jsonl").string(), *tok);
  ASSERT_EQ(pairs.size(), 2u);
  const int64_t seq = 32;
  Batch b = make_sft_batch({&pairs[0], &pairs[1]}, seq, 0);
  auto ids = b.ids.to_int_vector(), tg = b.targets.to_int_vector();
  for (int r = 0; r < 2; ++r) {
    const SftPair& p = pairs[r];
    std::vector<int64_t> all(p.input.begin(), p.input.end());
    all.insert(all.end(), p.output.begin(), p.output.end());
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t target = tg[r * seq + t];
      if (t + 1 < static_cast<int64_t>(p.input.size())) {
        EXPECT_EQ(target, -100) << "input token " << t << " must carry no loss";
      } else if (t + 1 < static_cast<int64_t>(all.size())) {
        EXPECT_EQ(target, all[t + 1]);
        EXPECT_EQ(ids[r * seq + t], all[t]);
      } else {
        EXPECT_EQ(target, -100) << "padding";
      }
    }
  }
  // the first output token is predicted from the last input token
  EXPECT_EQ(tg[pairs[0].input.size() - 1], pairs[0].output[0]);

  write_text(dir / "bad.jsonl", "{\"input\": \"a\", \"output\": \"b\"}\n{\"input\": \"a\"}\n");
  try {
    load_sft_pairs((dir / "bad.jsonl").string(), *tok);
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
  }
  write_text(dir / "bad2.jsonl", "{\"input\": \"a\", \"output\": \"b\"}\n\n{not json\n");
  try {
    load_sft_pairs((dir / "bad2.jsonl").string(), *tok);
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("bad2.jsonl:3"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// ---- checkpoints and training ----

TrainOptions base_options(const fs::path& out, int64_t steps) {
  TrainOptions o;
  o.out_dir = out.string();
  o.steps = steps;
  o.batch = 4;
  o.seq = 32;
  o.grad_accum = 2;
  o.schedule.kind = ScheduleKind::kCosine;
  o.schedule.lr = 3e-3;
  o.schedule.warmup = 2;
  o.eval_every = 3;
  o.eval_batches = 2;
  o.sample_tokens = 4;
  o.progress = false;
  o.seed = 5;
  return o;
}

void expect_same_tensors(const std::string& a, const std::string& b) {
  auto fa = io::SafetensorsFile::open(a), fb = io::SafetensorsFile::open(b);
  ASSERT_EQ(fa.names(), fb.names());
  for (const auto& name : fa.names()) {
    Tensor ta = fa.get(name), tb = fb.get(name);
    ASSERT_EQ(ta.shape(), tb.shape()) << name;
    EXPECT_EQ(std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()), 0) << name << " differs";
  }
}

// AdamW moments of recognisable values (0.5 and 0.25), one per parameter of m.
void fill_moments(const model::Decoder& m, std::vector<Tensor>& ea, std::vector<Tensor>& eas) {
  for (const Tensor& p : m.parameters()) {
    ea.push_back(Tensor::full(p.shape(), 0.5));
    eas.push_back(Tensor::full(p.shape(), 0.25));
  }
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.insert(e.path().filename().string());
  return files;
}

TEST(Checkpoint, StepFolderPointerAndModelDirView) {
  fs::path dir = temp_dir("ckpt");
  model::Decoder m(small_config());
  m.init_weights(1);
  std::vector<Tensor> ea, eas;
  fill_moments(m, ea, eas);
  TrainerState st;
  st.step = 5;
  st.sampler = Generator(3).state();
  EXPECT_FALSE(has_checkpoint(dir.string()));
  for (int round = 0; round < 2; ++round) {
    const std::string ck = save_checkpoint(dir.string(), m, ea, eas, st, "");
    EXPECT_EQ(ck, (dir / "checkpoints" / "step-00000005").string());
    // one complete step folder, no temporary or partial file beside the final names
    EXPECT_EQ(names_in(ck), (std::set<std::string>{"config.json", "model.safetensors", "optimizer.safetensors",
                                                   "trainer_state.json"}));
    EXPECT_EQ(names_in(dir / "checkpoints"), (std::set<std::string>{"latest", "step-00000005"}));
    // OUT itself is a model directory: hard links to the latest checkpoint's files
    EXPECT_EQ(names_in(dir), (std::set<std::string>{"checkpoints", "config.json", "model.safetensors"}));
    EXPECT_TRUE(fs::equivalent(dir / "model.safetensors", fs::path(ck) / "model.safetensors"));
  }
  EXPECT_EQ(latest_checkpoint(dir.string()), (dir / "checkpoints" / "step-00000005").string());
  EXPECT_EQ(checkpoint_steps(dir.string()), (std::vector<int64_t>{5}));
  model::Decoder m2(small_config());
  std::vector<Tensor> ea2, eas2;
  for (const Tensor& p : m2.parameters()) {
    ea2.push_back(Tensor::zeros(p.shape()));
    eas2.push_back(Tensor::zeros(p.shape()));
  }
  TrainerState back = load_checkpoint(dir.string(), m2, ea2, eas2);
  EXPECT_EQ(back.step, 5);
  EXPECT_EQ(back.sampler.s[2], st.sampler.s[2]);
  EXPECT_EQ(ea2[0].to_float_vector()[0], 0.5f);
  EXPECT_EQ(m2.parameters()[0].to_float_vector(), m.parameters()[0].to_float_vector());

  // A second save moves the pointer; the first step folder stays until pruned.
  st.step = 7;
  save_checkpoint(dir.string(), m, ea, eas, st, "");
  EXPECT_EQ(latest_checkpoint(dir.string()), (dir / "checkpoints" / "step-00000007").string());
  EXPECT_EQ(checkpoint_steps(dir.string()), (std::vector<int64_t>{5, 7}));
  fs::create_directories(dir / "checkpoints" / ".step-00000009.staging.1.0");  // a killed save's leftover
  prune_checkpoints(dir.string(), {7});
  EXPECT_EQ(names_in(dir / "checkpoints"), (std::set<std::string>{"latest", "step-00000007"}));
  prune_checkpoints(dir.string(), {});  // never the one the pointer names
  EXPECT_EQ(checkpoint_steps(dir.string()), (std::vector<int64_t>{7}));

  // a trainer_state.json from another step than the weights: refuse to resume from a torn checkpoint
  const fs::path state = dir / "checkpoints" / "step-00000007" / "trainer_state.json";
  auto j = nlohmann::json::parse(std::ifstream(state));
  j["step"] = 6;
  write_text(state, j.dump());
  EXPECT_THROW(load_checkpoint(dir.string(), m2, ea2, eas2), FormatError);
  // a pointer naming a missing folder is an error naming it, not "no checkpoint"
  write_text(dir / "checkpoints" / "latest", "step-00000042\n");
  try {
    latest_checkpoint(dir.string());
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("step-00000042"), std::string::npos) << e.what();
  }
  // non-finite weights are never saved
  write_text(dir / "checkpoints" / "latest", "step-00000007\n");
  Tensor w = m.parameters()[0];
  w.data<float>()[3] = std::nanf("");
  st.step = 8;
  EXPECT_THROW(save_checkpoint(dir.string(), m, ea, eas, st, ""), TrainingDiverged);
  EXPECT_EQ(latest_checkpoint(dir.string()), (dir / "checkpoints" / "step-00000007").string());
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step-00000008"));
  EXPECT_TRUE(decays("model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(decays("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(decays("model.layers.0.self_attn.q_proj.bias"));
  fs::remove_all(dir);
}

// An output folder of the older layout (every file at its top level) still resumes.
TEST(Checkpoint, OlderLayoutResumes) {
  fs::path dir = temp_dir("ckpt_old");
  model::Decoder m(small_config());
  m.init_weights(1);
  std::vector<Tensor> ea, eas;
  fill_moments(m, ea, eas);
  TrainerState st;
  st.step = 3;
  // Written as the older save_checkpoint did: the files of a step folder, at the top of OUT.
  const std::string ck = save_checkpoint((dir / "tmp").string(), m, ea, eas, st, "");
  for (const auto& e : fs::directory_iterator(ck)) fs::copy_file(e.path(), dir / e.path().filename());
  fs::remove_all(dir / "tmp");
  EXPECT_EQ(latest_checkpoint(dir.string()), dir.string());
  std::vector<Tensor> ea2 = ea, eas2 = eas;
  EXPECT_EQ(load_checkpoint(dir.string(), m, ea2, eas2).step, 3);
  // The next save converts it: the state files move into a step folder.
  st.step = 4;
  save_checkpoint(dir.string(), m, ea, eas, st, "");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"checkpoints", "config.json", "model.safetensors"}));
  EXPECT_EQ(load_checkpoint(dir.string(), m, ea2, eas2).step, 4);
  fs::remove_all(dir);
}

TEST(Trainer, ResumeIsBitIdentical) {
  fs::path root = temp_dir("resume");
  TokenDataset data = TokenDataset::from_ids(pattern_tokens(4000, 2));
  Split split = split_tokens(data.size(), 0.1, 32);
  auto val = sequential_batches(data, split.train_end, data.size(), 4, 32, 2);
  const int64_t n = 4;

  model::Decoder straight(small_config());
  straight.init_weights(11);
  WindowSampler s1(data, 0, split.train_end, 5);
  TrainResult r1 = train(straight, s1, &val, nullptr, "", base_options(root / "straight", 2 * n));
  EXPECT_EQ(r1.end_step, 2 * n);

  model::Decoder first(small_config());
  first.init_weights(11);
  WindowSampler s2(data, 0, split.train_end, 5);
  TrainOptions o = base_options(root / "resumed", 2 * n);
  o.stop_at = n;
  EXPECT_EQ(train(first, s2, &val, nullptr, "", o).end_step, n);

  model::Decoder second(small_config());
  second.init_weights(999);  // overwritten by the checkpoint
  WindowSampler s3(data, 0, split.train_end, 12345);  // state restored from the checkpoint
  o.stop_at = 0;
  o.resume = true;
  TrainResult r3 = train(second, s3, &val, nullptr, "", o);
  EXPECT_EQ(r3.start_step, n);
  EXPECT_EQ(r3.end_step, 2 * n);

  expect_same_tensors((root / "straight" / "model.safetensors").string(),
                      (root / "resumed" / "model.safetensors").string());
  expect_same_tensors(latest_checkpoint((root / "straight").string()) + "/optimizer.safetensors",
                      latest_checkpoint((root / "resumed").string()) + "/optimizer.safetensors");
  EXPECT_EQ(r3.checkpoint, (root / "resumed" / "checkpoints" / "step-00000008").string());
  for (size_t i = 0; i < straight.parameters().size(); ++i)
    EXPECT_EQ(straight.parameters()[i].to_float_vector(), second.parameters()[i].to_float_vector());
  // the logs agree line for line on the loss
  auto losses = [](const fs::path& p) {
    std::vector<double> out;
    std::ifstream in(p);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return out;
  };
  EXPECT_EQ(losses(root / "straight" / "train_log.jsonl"), losses(root / "resumed" / "train_log.jsonl"));
  EXPECT_EQ(losses(root / "straight" / "train_log.jsonl").size(), static_cast<size_t>(2 * n));
  fs::remove_all(root);
}

TEST(Trainer, LossGoesDownOnRepetitiveData) {
  fs::path root = temp_dir("learn");
  TokenDataset data = TokenDataset::from_ids(pattern_tokens(4000, 3));
  Split split = split_tokens(data.size(), 0.1, 32);
  auto val = sequential_batches(data, split.train_end, data.size(), 4, 32, 2);
  model::Decoder m(small_config());
  m.init_weights(1);
  const double before = evaluate(m, val).mean_loss;
  WindowSampler s(data, 0, split.train_end, 1);
  TrainOptions o = base_options(root, 30);
  o.grad_accum = 1;
  o.schedule.lr = 1e-2;
  o.eval_every = 10;
  TrainResult r = train(m, s, &val, nullptr, "", o);
  std::ifstream log(root / "train_log.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(log, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s"}) EXPECT_TRUE(j.contains(key)) << key;
    ++lines;
  }
  EXPECT_EQ(lines, 30);
  EXPECT_NEAR(before, std::log(256.0), 0.3);
  ASSERT_TRUE(r.last_val_loss.has_value());
  EXPECT_LT(*r.last_val_loss, before - 2.0) << "val loss " << before << " -> " << *r.last_val_loss;
  ASSERT_EQ(r.curve.size(), 3u);
  EXPECT_LT(r.curve.back().val_loss, r.curve.front().val_loss);
  fs::remove_all(root);
}

TEST(Trainer, KeepCheckpointsPrunesOnlyAfterThePointerMoved) {
  fs::path root = temp_dir("keep");
  TokenDataset data = TokenDataset::from_ids(pattern_tokens(2000, 2));
  model::Decoder m(small_config());
  m.init_weights(3);
  WindowSampler s(data, 0, data.size(), 5);
  TrainOptions o = base_options(root, 6);
  o.grad_accum = 1;
  o.save_every = 1;
  o.keep_checkpoints = 2;
  TrainResult r = train(m, s, nullptr, nullptr, "", o);
  EXPECT_EQ(checkpoint_steps(root.string()), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(r.checkpoint, latest_checkpoint(root.string()));
  // a resumed run counts the folders it continues from
  o.steps = 8;
  o.resume = true;
  o.keep_checkpoints = 3;
  model::Decoder m2(small_config());
  WindowSampler s2(data, 0, data.size(), 5);
  train(m2, s2, nullptr, nullptr, "", o);
  EXPECT_EQ(checkpoint_steps(root.string()), (std::vector<int64_t>{6, 7, 8}));
  // a run without --resume starts over: its first save replaces the older run's checkpoints
  o.resume = false;
  o.steps = 2;
  o.save_every = 0;
  model::Decoder m3(small_config());
  m3.init_weights(4);
  WindowSampler s3(data, 0, data.size(), 5);
  train(m3, s3, nullptr, nullptr, "", o);
  EXPECT_EQ(checkpoint_steps(root.string()), (std::vector<int64_t>{2}));
  fs::remove_all(root);
}

TEST(Trainer, NoValidationMeansNoValLoss) {
  fs::path root = temp_dir("noval");
  TokenDataset data = TokenDataset::from_ids(pattern_tokens(2000, 2));
  model::Decoder m(small_config());
  m.init_weights(3);
  WindowSampler s(data, 0, data.size(), 5);
  TrainOptions o = base_options(root, 2);
  const std::vector<Batch> none;  // what --eval-batches 0 gives
  TrainResult r = train(m, s, &none, nullptr, "", o);
  EXPECT_FALSE(r.last_val_loss.has_value());
  EXPECT_TRUE(r.curve.empty());
  std::ifstream log(root / "train_log.jsonl");
  std::string line;
  while (std::getline(log, line)) EXPECT_FALSE(nlohmann::json::parse(line).contains("val_loss")) << line;
  EXPECT_EQ(split_tokens(100, 0.0, 16).train_end, 100);  // --val-fraction 0: no validation split
  EXPECT_EQ(sft_validation_pairs(10, 0.0), 0u);
  EXPECT_EQ(sft_validation_pairs(10, 0.05), 1u);
  EXPECT_THROW(sft_validation_pairs(10, -0.5), ValueError);
  EXPECT_THROW(split_tokens(100, 1.0, 16), ValueError);
  fs::remove_all(root);
}

TEST(Trainer, DivergenceStopsWithoutSavingANonFiniteCheckpoint) {
  fs::path root = temp_dir("diverge");
  TokenDataset data = TokenDataset::from_ids(pattern_tokens(2000, 2));
  model::Decoder m(small_config());
  m.init_weights(3);
  WindowSampler s(data, 0, data.size(), 5);
  TrainOptions o = base_options(root, 10);
  o.grad_accum = 1;
  o.stop_at = 2;
  train(m, s, nullptr, nullptr, "", o);
  const std::string good = latest_checkpoint(root.string());
  // --lr 1e30 and no clipping: the weights blow up and the next loss is not finite
  o.stop_at = 0;
  o.resume = true;
  o.clip = 0;
  o.schedule.lr = 1e30;
  o.schedule.warmup = 0;
  model::Decoder m2(small_config());
  WindowSampler s2(data, 0, data.size(), 5);
  try {
    train(m2, s2, nullptr, nullptr, "", o);
    FAIL() << "expected TrainingDiverged";
  } catch (const TrainingDiverged& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("diverged"), std::string::npos) << what;
    EXPECT_NE(what.find(good), std::string::npos) << "names the last good checkpoint: " << what;
  }
  EXPECT_EQ(latest_checkpoint(root.string()), good);
  EXPECT_EQ(checkpoint_steps(root.string()), (std::vector<int64_t>{2}));
  model::Decoder back(small_config());
  std::vector<Tensor> ea, eas;
  for (const Tensor& p : back.parameters()) {
    ea.push_back(Tensor::zeros(p.shape()));
    eas.push_back(Tensor::zeros(p.shape()));
  }
  EXPECT_EQ(load_checkpoint(root.string(), back, ea, eas).step, 2);
  for (const Tensor& p : back.parameters())
    for (float v : p.to_float_vector()) ASSERT_TRUE(std::isfinite(v));
  fs::remove_all(root);
}

TEST(TrainOptions, OutOfRangeValuesAreErrorsNamingTheOption) {
  const fs::path root = fs::temp_directory_path() / ("corelm_train_test_opts_" + std::to_string(::getpid()));
  const std::vector<std::pair<std::string, std::function<void(TrainOptions&)>>> cases = {
      {"--warmup", [](TrainOptions& o) { o.schedule.warmup = -3; }},
      {"--clip", [](TrainOptions& o) { o.clip = -1; }},
      {"--time-budget", [](TrainOptions& o) { o.time_budget_s = -1; }},
      {"--min-lr-ratio", [](TrainOptions& o) { o.schedule.min_lr_ratio = -1; }},
      {"--min-lr-ratio", [](TrainOptions& o) { o.schedule.min_lr_ratio = 1.5; }},
      {"--lr", [](TrainOptions& o) { o.schedule.lr = -1e-3; }},
      {"--lr", [](TrainOptions& o) { o.schedule.lr = std::nan(""); }},
      {"--steps", [](TrainOptions& o) { o.steps = 0; }},
      {"--stop-at", [](TrainOptions& o) { o.stop_at = -1; }},
      {"--batch", [](TrainOptions& o) { o.batch = 0; }},
      {"--grad-accum", [](TrainOptions& o) { o.grad_accum = -2; }},
      {"--weight-decay", [](TrainOptions& o) { o.weight_decay = -0.1f; }},
      {"--eval-every", [](TrainOptions& o) { o.eval_every = -1; }},
      {"--eval-batches", [](TrainOptions& o) { o.eval_batches = -1; }},
      {"--save-every", [](TrainOptions& o) { o.save_every = -5; }},
      {"--keep-checkpoints", [](TrainOptions& o) { o.keep_checkpoints = 0; }},
      {"--sample-tokens", [](TrainOptions& o) { o.sample_tokens = -1; }},
      {"--count-floor", [](TrainOptions& o) { o.sampled_floor = -1; }},
  };
  for (const auto& [option, mutate] : cases) {
    TrainOptions o = base_options(root, 4);
    EXPECT_NO_THROW(o.validate());
    mutate(o);
    try {
      o.validate();
      ADD_FAILURE() << option << ": expected ValueError";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
  }
  // train() checks first: nothing is written for a bad option
  TokenDataset data = TokenDataset::from_ids(pattern_tokens(500, 2));
  model::Decoder m(small_config());
  WindowSampler s(data, 0, data.size(), 5);
  TrainOptions o = base_options(root, 4);
  o.schedule.warmup = -3;
  EXPECT_THROW(train(m, s, nullptr, nullptr, "", o), ValueError);
  EXPECT_FALSE(fs::exists(root));
  // corelm eval's window options
  m.init_weights(1);
  EXPECT_THROW(evaluate_dataset(m, data, EvalOptions{-4, 4}), ValueError);
  EXPECT_THROW(evaluate_dataset(m, data, EvalOptions{1000, 4}), ValueError);
  EXPECT_THROW(evaluate_dataset(m, data, EvalOptions{0, 0}), ValueError);
  EXPECT_GT(evaluate_dataset(m, data, EvalOptions{16, 4}).tokens, 0);
}

TEST(ModelDir, CheckpointLoadsAsModelDirectory) {
  fs::path dir = temp_dir("modeldir"), tok_dir = temp_dir("modeldir_tok");
  const std::string tok = make_tokenizer(tok_dir);
  model::Decoder m(small_config(512));
  m.init_weights(4);
  model::save_model_dir(dir.string(), m);
  io::write_file_atomic((dir / "tokenizer.json").string(), std::string(std::istreambuf_iterator<char>(
                                                                std::ifstream(tok).rdbuf()), {}));
  model::LoadedModel loaded = model::load_model_dir(dir.string());
  EXPECT_EQ(loaded.tokenizer->vocab_size(), Tokenizer::load(tok)->vocab_size());
  ASSERT_EQ(loaded.decoder.named_parameters().size(), m.named_parameters().size());
  for (size_t i = 0; i < m.named_parameters().size(); ++i)
    EXPECT_EQ(loaded.decoder.named_parameters()[i].second.to_float_vector(),
              m.named_parameters()[i].second.to_float_vector());
  // a tensor missing from model.safetensors names the tensor
  auto params = m.named_parameters();
  params.pop_back();
  io::save_safetensors((dir / "model.safetensors").string(), params);
  try {
    model::load_model_dir(dir.string());
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(m.named_parameters().back().first), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::load_model_dir((dir / "nope").string()), IOError);
  fs::remove_all(dir);
  fs::remove_all(tok_dir);
}

}  // namespace
}  // namespace corelm::train
