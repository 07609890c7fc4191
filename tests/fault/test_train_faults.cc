// `corelm train` under faults, driven as a user would: kill -9 at each rename of a checkpoint
// save (strace fault injection), a full disk during a save (RLIMIT_FSIZE), SIGTERM, a second run
// on the same --out, divergence (--lr 1e30) and out-of-range options. After every fault the last
// committed checkpoint must be intact and `--resume` must reach bitwise the weights of an
// uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/cli_runner.h"
#include "common/model_factories.h"
#include "corelm/durable.h"
#include "corelm/model.h"
#include "corelm/tokenizer_train.h"
#include "corelm/train.h"

namespace fs = std::filesystem;
using corelm::testing::CliOptions;
using corelm::testing::CliResult;
using corelm::testing::run_corelm;
using corelm::testing::run_program;
using corelm::testing::ScratchDir;

namespace {

using corelm::testing::names;
using corelm::testing::slurp;

int64_t last_logged_step(const std::string& out) {
  std::ifstream in(out + "/train_log.jsonl");
  std::string line;
  int64_t step = 0;
  while (std::getline(in, line)) {
    try {
      step = nlohmann::json::parse(line).at("step").get<int64_t>();
    } catch (const std::exception&) {
    }
  }
  return step;
}

// The learning rate of each line of OUT's train_log.jsonl.
std::vector<double> logged_lrs(const std::string& out) {
  std::ifstream in(out + "/train_log.jsonl");
  std::vector<double> lr;
  for (std::string line; std::getline(in, line);) lr.push_back(nlohmann::json::parse(line).at("lr").get<double>());
  return lr;
}

// The step of the checkpoint OUT's pointer names, read through the library (-1: none).
int64_t committed_step(const std::string& out) {
  const std::string ck = corelm::train::latest_checkpoint(out);
  if (ck.empty()) return -1;
  return nlohmann::json::parse(slurp(ck + "/trainer_state.json")).at("step").get<int64_t>();
}

// A corpus, a tokenizer and a tiny config shared by the suite, plus two reference runs: 8 steps
// straight, and the first 4 of them (the starting point of every fault).
class TrainFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("train_faults");
    std::mt19937 rng(1);
    const std::vector<std::string> words = {"the", "cat", "sat", "on", "mat", "dog", "ran", "far", "and", "home"};
    std::string corpus;
    for (int line = 0; line < 600; ++line) {
      for (int w = 0; w < 10; ++w) corpus += words[rng() % words.size()] + (w == 9 ? "\n" : " ");
    }
    std::ofstream(*dir_ / "corpus.txt") << corpus;
    corelm::BpeTrainOptions bpe;
    bpe.vocab_size = 300;
    bpe.progress = false;
    corelm::train_bpe({*dir_ / "corpus.txt"}, bpe, *dir_ / "tok.json");
    corelm::testing::tiny_decoder_config(320, 0.02).save(*dir_ / "cfg.json");
    const CliResult ref = run_corelm(args(*dir_ / "ref", 8, {"--save-every", "2"}), quick());
    ASSERT_EQ(ref.rc, 0) << ref.all();
    const CliResult base = run_corelm(args(*dir_ / "base", 8, {"--stop-at", "4"}), quick());
    ASSERT_EQ(base.rc, 0) << base.all();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static CliOptions quick(double timeout_s = 60) {
    CliOptions o;
    o.timeout_s = timeout_s;
    return o;
  }
  static std::vector<std::string> args(const std::string& out, int64_t steps, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"train", "--config", *dir_ / "cfg.json", "--tokenizer", *dir_ / "tok.json",
                                  "--data", *dir_ / "corpus.txt", "--out", out, "--steps", std::to_string(steps),
                                  "--batch", "2", "--seq", "16", "--threads", "1", "--eval-batches", "1",
                                  "--sample-tokens", "0", "--seed", "1", "--no-progress"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // A copy of the 4-step run to break.
  static std::string fresh_copy(const ScratchDir& d, const std::string& name) {
    const std::string out = d / name;
    fs::copy(*dir_ / "base", out, fs::copy_options::recursive);
    return out;
  }
  static std::string ref_weights() { return slurp(*dir_ / "ref/model.safetensors"); }
  static std::string base_ck() { return *dir_ / "base/checkpoints/step-00000004"; }

  static ScratchDir* dir_;
};
ScratchDir* TrainFaults::dir_ = nullptr;

// The checkpoint the pointer names is step 4 untouched or a later complete one, and a resume
// reaches the uninterrupted run's weights bit for bit.
void expect_recovers(const std::string& out, const std::string& label, const std::vector<std::string>& resume_args,
                     const std::string& base_ck, const std::string& ref_weights, bool only_final_save = true) {
  const int64_t step = committed_step(out);
  if (only_final_save) {
    ASSERT_TRUE(step == 4 || step == 8) << label << ": pointer names step " << step;
  } else {
    ASSERT_TRUE(step >= 4 && step <= 8) << label << ": pointer names step " << step;
  }
  if (step == 4) {
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json"})
      EXPECT_EQ(slurp(out + "/checkpoints/step-00000004/" + f), slurp(base_ck + "/" + f)) << label << ": " << f;
  }
  const CliResult r = run_corelm(resume_args);
  ASSERT_EQ(r.rc, 0) << label << ": resume failed: " << r.all();
  EXPECT_EQ(committed_step(out), 8) << label;
  EXPECT_TRUE(slurp(out + "/model.safetensors") == ref_weights) << label << ": resumed weights differ from a straight run";
  for (const auto& n : names(out + "/checkpoints")) EXPECT_NE(n[0], '.') << label << ": leftover " << n;
}

TEST_F(TrainFaults, KillDuringSaveLeavesAResumableCheckpoint) {
  if (!corelm::testing::have_program("strace") ||
      run_program("strace", {"-f", "-qq", "-o", "/dev/null", "true"}, quick(10)).rc != 0)
    GTEST_SKIP() << "strace is missing or cannot trace here (ptrace not permitted)";
  ScratchDir d("train_faults_kill");
  // The save of step 8 does 10 renames (5 files in the step folder, the folder, the pointer, 3
  // links of the model-directory view): kill before each kind of them.
  int killed = 0;
  for (int n : {1, 2, 4, 5, 6, 7, 8, 10}) {
    const std::string out = fresh_copy(d, "k" + std::to_string(n));
    std::vector<std::string> a = {"-f", "-qq", "-o", "/dev/null", "-e", "trace=rename",
                                  "-e", "inject=rename:signal=KILL:when=" + std::to_string(n), corelm::testing::corelm_path()};
    const auto train_args = args(out, 8, {"--resume"});
    a.insert(a.end(), train_args.begin(), train_args.end());
    const CliResult r = run_program("strace", a, quick());
    ASSERT_FALSE(r.timed_out);
    if (r.rc == 0) continue;
    ++killed;
    EXPECT_EQ(r.rc, 128 + SIGKILL) << "rename " << n << ": " << r.all();
    // The dead holder's lock record is left behind; the next run must take it over.
    expect_recovers(out, "kill at rename " + std::to_string(n), train_args, base_ck(), ref_weights());
  }
  EXPECT_EQ(killed, 8);
}

// Without strace: kill -9 at a random moment of a run that saves every step.
TEST_F(TrainFaults, KillAtRandomMomentsThenResume) {
  ScratchDir d("train_faults_rkill");
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string out = fresh_copy(d, "r" + std::to_string(attempt));
    const auto train_args = args(out, 8, {"--resume", "--save-every", "1"});
    const pid_t pid = corelm::testing::spawn_corelm(train_args, "/dev/null");
    std::this_thread::sleep_for(std::chrono::milliseconds(60 + 70 * attempt));
    ::kill(pid, SIGKILL);
    corelm::testing::wait_exit(pid);
    expect_recovers(out, "random kill " + std::to_string(attempt), train_args, base_ck(), ref_weights(), false);
  }
}

TEST_F(TrainFaults, DiskFullDuringSaveKeepsThePreviousCheckpoint) {
  ScratchDir d("train_faults_full");
  const std::string out = fresh_copy(d, "full");
  // Room for the weights, not for the optimizer state (twice their size): the save fails midway.
  CliOptions limited = quick();
  limited.fsize_limit = static_cast<long>(fs::file_size(base_ck() + "/model.safetensors") + 65536);
  const auto resume = args(out, 8, {"--resume"});
  const CliResult r = run_corelm(resume, limited);
  EXPECT_NE(r.rc, 0) << r.all();
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step-00000004"), std::string::npos) << "names the checkpoint still in place: " << r.err;
  EXPECT_EQ(names(out + "/checkpoints"), (std::vector<std::string>{"latest", "step-00000004"}));
  EXPECT_EQ(slurp(out + "/model.safetensors"), slurp(base_ck() + "/model.safetensors"));
  expect_recovers(out, "disk full", resume, base_ck(), ref_weights());
}

TEST_F(TrainFaults, ATimeBudgetThatStopsTheRunEarlySaysSo) {
  ScratchDir d("train_faults_budget");
  const std::string out = d / "budget";
  const CliResult r = run_corelm(args(out, 100000, {"--save-every", "0", "--time-budget", "0.5", "--eval-every", "0"}), quick(90));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 0) << r.all();
  EXPECT_NE(r.out.find("\"stopped_by_time_budget\":true"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("--time-budget 0.5 s stopped the run after step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("continue with --resume"), std::string::npos) << r.err;
  EXPECT_GT(last_logged_step(out), 0);
  EXPECT_LT(last_logged_step(out), 100000);

  // A run that reaches its last step inside the budget does not claim the budget stopped it.
  const std::string done = d / "done";
  const CliResult full = run_corelm(args(done, 3, {"--time-budget", "60"}), quick());
  EXPECT_EQ(full.rc, 0) << full.all();
  EXPECT_EQ(full.out.find("stopped_by_time_budget"), std::string::npos) << full.out;
  EXPECT_EQ(full.err.find("--time-budget"), std::string::npos) << full.err;
}

TEST_F(TrainFaults, SigtermCheckpointsAndASecondRunIsRefused) {
  ScratchDir d("train_faults_term");
  const std::string out = d / "term";
  CliResult first;
  std::thread runner([&] {
    first = run_corelm(args(out, 100000, {"--save-every", "0", "--time-budget", "60", "--eval-every", "0"}), quick(90));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (last_logged_step(out) < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const corelm::LockHolder holder = corelm::FileLock::read_holder(out + "/train.lock");
  ASSERT_GT(holder.pid, 0) << "no lock record in " << out;

  const CliResult second = run_corelm(args(out, 10), quick());
  EXPECT_NE(second.rc, 0);
  EXPECT_NE(second.err.find("pid " + std::to_string(holder.pid)), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("train.lock"), std::string::npos) << second.err;

  ::kill(static_cast<pid_t>(holder.pid), SIGTERM);
  runner.join();
  ASSERT_FALSE(first.timed_out);
  EXPECT_EQ(first.rc, 128 + SIGTERM) << first.all();
  EXPECT_NE(first.out.find("\"stopped_by_signal\":\"SIGTERM\""), std::string::npos) << first.out;
  EXPECT_FALSE(fs::exists(out + "/train.lock"));
  const int64_t k = committed_step(out);
  EXPECT_EQ(k, last_logged_step(out)) << "the checkpoint holds the last step trained";
  ASSERT_GT(k, 0);
  const CliResult resumed = run_corelm(args(out, k + 2, {"--resume"}), quick());
  ASSERT_EQ(resumed.rc, 0) << resumed.all();
  EXPECT_EQ(nlohmann::json::parse(resumed.out).at("start_step").get<int64_t>(), k);
  // OUT stays a model directory the other commands load.
  const CliResult gen = run_corelm({"generate", "--model", out, "--prompt", "the cat", "-n", "4"}, quick());
  EXPECT_EQ(gen.rc, 0) << gen.all();
  const CliResult ev = run_corelm({"eval", "--model", out, "--data", *dir_ / "corpus.txt", "--seq", "16", "--json"}, quick());
  EXPECT_EQ(ev.rc, 0) << ev.all();
}

TEST_F(TrainFaults, KeepCheckpointsPrunes) {
  // the reference run saved every 2 steps and keeps the default 2
  EXPECT_EQ(names(*dir_ / "ref/checkpoints"), (std::vector<std::string>{"latest", "step-00000006", "step-00000008"}));
  ScratchDir d("train_faults_keep");
  const CliResult r = run_corelm(args(d / "keep", 6, {"--save-every", "1", "--keep-checkpoints", "3"}), quick());
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_EQ(corelm::train::checkpoint_steps(d / "keep"), (std::vector<int64_t>{4, 5, 6}));
}

// Warmup-stable-decay lets a run grow: a checkpoint taken before the decay starts resumes into a
// longer --steps and reaches the weights of a run planned that long from the start, bit for bit
// (the stable phase does not depend on the total), with the decay over the longer run's tail.
TEST_F(TrainFaults, WsdStableCheckpointResumesIntoALongerRun) {
  ScratchDir d("train_faults_wsd");
  const std::vector<std::string> wsd = {"--schedule", "wsd", "--decay-fraction", "0.25", "--warmup", "1",
                                        "--min-lr-ratio", "0.1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), wsd.begin(), wsd.end());
    return extra;
  };
  const CliResult whole = run_corelm(args(d / "whole", 12, with({})), quick());
  ASSERT_EQ(whole.rc, 0) << whole.all();
  // Planned for 8 steps (decay from step 6), stopped at 4: still on the plateau.
  const CliResult part = run_corelm(args(d / "grow", 8, with({"--stop-at", "4"})), quick());
  ASSERT_EQ(part.rc, 0) << part.all();
  ASSERT_EQ(committed_step(d / "grow"), 4);
  const CliResult grown = run_corelm(args(d / "grow", 12, with({"--resume"})), quick());
  ASSERT_EQ(grown.rc, 0) << grown.all();
  EXPECT_EQ(committed_step(d / "grow"), 12);
  EXPECT_EQ(slurp(d / "grow/model.safetensors"), slurp(d / "whole/model.safetensors"));
  const std::vector<double> lr = logged_lrs(d / "whole");
  ASSERT_EQ(lr.size(), 12u);
  for (size_t i = 0; i < 9; ++i) EXPECT_DOUBLE_EQ(lr[i], lr[0]) << "step " << i + 1 << " is on the plateau";
  EXPECT_LT(lr[9], lr[8]);
  EXPECT_LT(lr[10], lr[9]);
  EXPECT_NEAR(lr[11], 0.1 * lr[0], 1e-12 * lr[0]);
  // The flag reaches the schedule: another fraction moves the decay.
  const CliResult half = run_corelm(args(d / "half", 12, {"--schedule", "wsd", "--decay-fraction", "0.5", "--warmup", "1"}),
                                    quick());
  ASSERT_EQ(half.rc, 0) << half.all();
  const std::vector<double> hlr = logged_lrs(d / "half");
  ASSERT_EQ(hlr.size(), 12u);
  EXPECT_DOUBLE_EQ(hlr[5], hlr[0]);
  EXPECT_LT(hlr[6], hlr[5]);
}

TEST_F(TrainFaults, DivergenceIsAnErrorAndSavesNothing) {
  ScratchDir d("train_faults_lr");
  const std::string out = d / "lr";
  const CliResult r = run_corelm(args(out, 6, {"--lr", "1e30"}), quick());
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("diverged"), std::string::npos) << r.err;
  EXPECT_FALSE(corelm::train::has_checkpoint(out));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  // From a good checkpoint: it stays the one --resume loads.
  const std::string good = fresh_copy(d, "good");
  const CliResult r2 = run_corelm(args(good, 8, {"--resume", "--lr", "1e30", "--clip", "0"}), quick());
  EXPECT_EQ(r2.rc, 1) << r2.all();
  EXPECT_NE(r2.err.find("step-00000004"), std::string::npos) << r2.err;
  EXPECT_EQ(committed_step(good), 4);
  EXPECT_EQ(slurp(good + "/model.safetensors"), slurp(base_ck() + "/model.safetensors"));
}

TEST_F(TrainFaults, OutOfRangeOptionsAreRefusedNamingTheOption) {
  ScratchDir d("train_faults_opts");
  const std::string out = d / "o";
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--warmup", "-3"}, {"--clip", "-1"}, {"--time-budget", "-1"}, {"--min-lr-ratio", "-1"},
           {"--decay-fraction", "1.5"},
           {"--val-fraction", "1.5"}, {"--keep-checkpoints", "0"}, {"--eval-every", "-2"}, {"--lr", "0"}}) {
    const CliResult r = run_corelm(args(out, 4, {option, value}), quick());
    EXPECT_EQ(r.rc, 1) << option << " " << value << ": " << r.all();
    EXPECT_NE(r.err.find(option), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out)) << option << ": nothing is written for a bad option";
  }
  const CliResult ev = run_corelm({"eval", "--model", *dir_ / "ref", "--data", *dir_ / "corpus.txt", "--seq", "-4"},
                                  quick());
  EXPECT_EQ(ev.rc, 1) << ev.all();
  EXPECT_NE(ev.err.find("--seq"), std::string::npos) << ev.err;
  // No validation data: val_loss is null, not 0.
  for (const auto& off : std::vector<std::vector<std::string>>{{"--val-fraction", "0"}, {"--eval-batches", "0"}}) {
    std::vector<std::string> a = args(d / ("noval" + off[0]), 2);
    a.erase(std::find(a.begin(), a.end(), "--eval-batches"), std::find(a.begin(), a.end(), "--eval-batches") + 2);
    a.insert(a.end(), off.begin(), off.end());
    const CliResult r = run_corelm(a, quick());
    ASSERT_EQ(r.rc, 0) << r.all();
    EXPECT_TRUE(nlohmann::json::parse(r.out).at("val_loss").is_null()) << off[0] << ": " << r.out;
  }
}

}  // namespace

// A model whose vocabulary is larger than its tokenizer's (a BPE trained on little text, or a
// padded embedding) used to end training with "token id N is outside the vocabulary" when the
// progress sample picked an id the tokenizer cannot decode.
TEST_F(TrainFaults, ASampleNeverPicksAnIdTheTokenizerLacks) {
  ScratchDir d("train_big_vocab");
  corelm::model::ModelConfig big = corelm::testing::tiny_decoder_config(4096, 0.2);
  big.tie_word_embeddings = false;  // an untied head's argmax lands anywhere in the 4096 ids
  big.save(d / "big.json");
  std::vector<std::string> a = args(d / "out", 2, {"--sample-tokens", "16", "--eval-every", "1"});
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == "--config") a[i + 1] = d / "big.json";
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == "--sample-tokens" && a[i + 1] == "0") a.erase(a.begin() + i, a.begin() + i + 2);
  const CliResult r = run_corelm(a, quick());
  EXPECT_EQ(r.rc, 0) << r.all();
  EXPECT_NE(slurp(d / "out/train_log.jsonl").find("\"sample\""), std::string::npos);
}
