// Data-parallel training (src/train/data_parallel.h): the bucket plan, the gradient-ready hook it
// relies on, the checksum, and the real thing under mpirun: N ranks with --batch B reach the
// weights of one process with --batch N*B (pretraining and SFT), a checkpoint resumes with another
// rank count, a diverged rank is a clear error, and a killed rank ends the job instead of hanging.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/cli_runner.h"
#include "common/model_factories.h"
#include "corelm/autograd.h"
#include "corelm/ops.h"
#include "corelm/safetensors.h"
#include "corelm/tokenizer_train.h"
#include "corelm/train.h"
#include "train/data_parallel.h"

namespace corelm::train {
namespace {
namespace fs = std::filesystem;
using corelm::testing::CliOptions;
using corelm::testing::CliResult;
using corelm::testing::run_program;
using corelm::testing::ScratchDir;
using corelm::testing::slurp;

// ---- the bucket plan ----

TEST(DataParallelBuckets, CoverEveryGradientExactlyOnceInBackwardOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> numels(1 + rng() % 40);
    for (auto& n : numels) n = (rng() % 5 == 0) ? 0 : 1 + rng() % 5000;
    const int64_t bucket_bytes = 4 * (1 + static_cast<int64_t>(rng() % 8000));
    const int64_t cap = bucket_bytes / 4;
    const std::vector<GradientBucket> plan = plan_buckets(numels, bucket_bytes);
    std::vector<int> seen(numels.size(), 0);
    std::vector<size_t> order;
    for (size_t b = 0; b < plan.size(); ++b) {
      const GradientBucket& g = plan[b];
      ASSERT_FALSE(g.params.empty());
      ASSERT_EQ(g.params.size(), g.offsets.size());
      int64_t at = 0;
      for (size_t j = 0; j < g.params.size(); ++j) {
        EXPECT_EQ(g.offsets[j], at) << "parameters are packed back to back";
        at += numels[g.params[j]];
        ++seen[g.params[j]];
        order.push_back(g.params[j]);
      }
      EXPECT_EQ(g.numel, at);
      // At most the size, unless a single parameter is larger; and a bucket was closed only
      // because the next parameter did not fit.
      if (g.params.size() > 1) {
        EXPECT_LE(g.numel, cap);
      }
      if (b + 1 < plan.size()) {
        EXPECT_GT(g.numel + numels[plan[b + 1].params.front()], cap);
      }
    }
    for (size_t i = 0; i < numels.size(); ++i) EXPECT_EQ(seen[i], 1) << "parameter " << i;
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], numels.size() - 1 - i) << "reverse order";
  }
}

TEST(DataParallelBuckets, OneBucketWhenTheSizeIsLargeAndOnePerParameterWhenSmall) {
  const std::vector<int64_t> numels{10, 20, 30};
  EXPECT_EQ(plan_buckets(numels, 1 << 20).size(), 1u);
  EXPECT_EQ(plan_buckets(numels, 4).size(), 3u);
  // The large parameter travels alone; the small ones around it are not held back with it.
  const std::vector<GradientBucket> p = plan_buckets({1000, 10, 10, 10}, 4 * 30);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].params, (std::vector<size_t>{3, 2, 1}));
  EXPECT_EQ(p[1].params, (std::vector<size_t>{0}));
  EXPECT_TRUE(plan_buckets({}, 1024).empty());
  EXPECT_THROW(plan_buckets(numels, 0), ValueError);
}

TEST(DataParallelChecksum, SeesOneFlippedBitAndNothingElse) {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5}, {5});
  Tensor b = Tensor::from_vector(std::vector<float>{0.5f, -1}, {2});
  const uint64_t h = parameter_checksum({a, b});
  EXPECT_EQ(parameter_checksum({a.clone(), b.clone()}), h);
  Tensor c = a.clone();
  uint32_t bits;
  std::memcpy(&bits, c.data<float>() + 4, 4);
  bits ^= 1u;  // the lowest mantissa bit of the last element
  std::memcpy(c.data<float>() + 4, &bits, 4);
  EXPECT_NE(parameter_checksum({c, b}), h);
  EXPECT_NE(parameter_checksum({b, a}), h) << "order matters";
}

// ---- the gradient-ready hook ----

// The hook fires once per leaf, after its gradient is final: a weight used twice (tied) is
// reported only after both uses have contributed, and what the hook sees equals .grad() at the end.
TEST(LeafGradHook, FiresOncePerLeafWithItsFinalGradient) {
  Tensor w = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f}, {2, 2});
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  w.set_requires_grad(true);
  x.set_requires_grad(true);
  std::map<const void*, int> calls;
  std::map<const void*, std::vector<float>> seen;
  {
    autograd::LeafGradHookScope scope([&](const Tensor& leaf) {
      ++calls[leaf.id()];
      seen[leaf.id()] = leaf.grad().to_float_vector();
    });
    // w is used twice: (x @ w) @ w; the hook must wait for both products' gradients.
    Tensor y = ops::matmul(ops::matmul(x, w), w);
    ops::sum(y).backward();
  }
  EXPECT_EQ(calls[w.id()], 1);
  EXPECT_EQ(calls[x.id()], 1);
  EXPECT_EQ(seen[w.id()], w.grad().to_float_vector());
  EXPECT_EQ(seen[x.id()], x.grad().to_float_vector());
  // Outside the scope nothing is called.
  w.zero_grad();
  x.zero_grad();
  calls.clear();
  ops::sum(ops::matmul(x, w)).backward();
  EXPECT_TRUE(calls.empty());
}

TEST(DataParallelOneProcess, EveryCallIsANoOp) {
  Tensor p = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  TrainOptions o;
  DataParallel dp(nullptr, {p}, o);
  EXPECT_FALSE(dp.enabled());
  EXPECT_EQ(dp.size(), 1);
  EXPECT_TRUE(dp.is_root());
  Batch b{Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2}),
          Tensor::from_vector(std::vector<int64_t>{2, -100, 4, 5}, {2, 2})};
  const DataParallel::Share s = dp.take_rows(b);
  EXPECT_EQ(s.local.ids.id(), b.ids.id()) << "the whole batch, not a copy";
  EXPECT_EQ(s.weight, 1.0);
  EXPECT_EQ(dp.watch_backward(true), nullptr);
  dp.reduce_gradients();
  EXPECT_EQ(dp.sum(2.5), 2.5);
  EXPECT_EQ(dp.max(3), 3);
  dp.after_update(100, true);
}

// ---- under mpirun ----

bool have_mpirun() { return corelm::testing::have_program("mpirun"); }

// OpenMPI refuses root without these; shared memory + loopback only, so no network is touched.
std::vector<std::string> mpi_env() {
  return {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_btl=self,vader,tcp",
          "OMPI_MCA_btl_tcp_if_include=lo", "ASAN_OPTIONS=detect_leaks=0"};
}

std::vector<std::string> mpirun_args(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> a{"-np", std::to_string(ranks), "--oversubscribe", corelm::testing::corelm_path()};
  a.insert(a.end(), args.begin(), args.end());
  return a;
}

// `corelm args...` on `ranks` MPI ranks (ranks 0: one plain process, no mpirun), time-bounded.
CliResult run_ranks(int ranks, const std::vector<std::string>& args, std::vector<std::string> env = {},
                    double timeout_s = 60) {
  CliOptions o;
  o.timeout_s = timeout_s;
  o.env = mpi_env();
  o.env.insert(o.env.end(), env.begin(), env.end());
  if (ranks == 0) return run_program("", args, o);
  return run_program("mpirun", mpirun_args(ranks, args), o);
}

std::map<std::string, std::vector<float>> weights(const std::string& out) {
  std::map<std::string, std::vector<float>> w;
  const io::SafetensorsFile f = io::SafetensorsFile::open(out + "/model.safetensors");
  for (const std::string& name : f.names()) w[name] = f.get(name).to_float_vector();
  return w;
}

// Equal within fp32 summation-order noise: the ranks sum their gradients in another order than
// one process's GEMMs do, and AdamW divides by sqrt(v), which magnifies the difference where a
// gradient is near zero; a wrong loss weighting (a mean of per-rank means) moves every weight.
void expect_same_weights(const std::string& a, const std::string& b) {
  const auto wa = weights(a), wb = weights(b);
  ASSERT_EQ(wa.size(), wb.size());
  double max_diff = 0, sum_diff = 0;
  int64_t n = 0;
  for (const auto& [name, va] : wa) {
    const auto it = wb.find(name);
    ASSERT_NE(it, wb.end()) << name;
    ASSERT_EQ(va.size(), it->second.size()) << name;
    for (size_t i = 0; i < va.size(); ++i) {
      const double d = std::fabs(static_cast<double>(va[i]) - it->second[i]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
      ++n;
    }
  }
  EXPECT_LT(max_diff, 1e-4) << a << " vs " << b;
  EXPECT_LT(sum_diff / static_cast<double>(n), 1e-7) << a << " vs " << b << " (mean absolute difference)";
}

class DataParallelMpi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("data_parallel");
    std::mt19937 rng(3);
    const std::vector<std::string> words = {"the", "cat", "sat", "on", "mat", "dog", "ran", "far", "and", "home"};
    std::string corpus;
    for (int line = 0; line < 400; ++line)
      for (int w = 0; w < 10; ++w) corpus += words[rng() % words.size()] + (w == 9 ? "\n" : " ");
    std::ofstream(*dir_ / "corpus.txt") << corpus;
    // SFT pairs of uneven lengths, so the ranks' slices hold different numbers of target tokens.
    std::ofstream sft(*dir_ / "pairs.jsonl");
    const std::vector<std::string> answers = {" yes", " no", " maybe so", " far and home"};
    for (int i = 0; i < 120; ++i) {
      std::string input;
      for (int w = 0, n = 1 + static_cast<int>(rng() % 9); w < n; ++w) input += (w ? " " : "") + words[rng() % 10];
      sft << nlohmann::json{{"input", input}, {"output", answers[rng() % answers.size()]}}.dump() << "\n";
    }
    sft.close();
    BpeTrainOptions bpe;
    bpe.vocab_size = 300;
    bpe.progress = false;
    train_bpe({*dir_ / "corpus.txt"}, bpe, *dir_ / "tok.json");
    corelm::testing::tiny_decoder_config(320, 0.02).save(*dir_ / "cfg.json");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin libopenmpi-dev)";
    ASSERT_TRUE(fs::exists(corelm::testing::corelm_path())) << "build the corelm binary (target corelm_cli)";
  }
  static std::vector<std::string> args(const std::string& out, int64_t steps, int64_t batch,
                                       std::vector<std::string> extra = {}, bool sft = false) {
    std::vector<std::string> a = {"train", "--config", *dir_ / "cfg.json", "--tokenizer", *dir_ / "tok.json",
                                  sft ? "--sft" : "--data", sft ? *dir_ / "pairs.jsonl" : *dir_ / "corpus.txt",
                                  "--out", *dir_ / out, "--steps", std::to_string(steps), "--batch",
                                  std::to_string(batch), "--seq", "16", "--threads", "1", "--eval-batches", "1",
                                  "--sample-tokens", "0", "--seed", "5", "--no-progress"};
    // Small buckets, so even this model's gradients travel in several overlapped messages.
    if (std::find(extra.begin(), extra.end(), "--bucket-kb") == extra.end()) extra.insert(extra.end(), {"--bucket-kb", "8"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static std::string out(const std::string& name) { return *dir_ / name; }
  static nlohmann::json summary(const CliResult& r) {
    try {
      return nlohmann::json::parse(r.out);
    } catch (const std::exception&) {
      ADD_FAILURE() << "not one JSON summary on stdout: " << r.out << r.err;
      return {};
    }
  }
  static ScratchDir* dir_;
};
ScratchDir* DataParallelMpi::dir_ = nullptr;

TEST_F(DataParallelMpi, TwoRanksEqualOneProcessWithTheGlobalBatch) {
  const CliResult one = run_ranks(0, args("one", 8, 4));
  ASSERT_EQ(one.rc, 0) << one.all();
  const CliResult two = run_ranks(2, args("two", 8, 2));
  ASSERT_EQ(two.rc, 0) << two.all();
  expect_same_weights(out("one"), out("two"));
  const nlohmann::json s1 = summary(one), s2 = summary(two);
  EXPECT_EQ(s2["ranks"], 2);
  EXPECT_EQ(s2["tokens_seen"], s1["tokens_seen"]) << "progress counts the global batch";
  EXPECT_NEAR(s2["train_loss"].get<double>(), s1["train_loss"].get<double>(), 1e-5);
  EXPECT_NEAR(s2["val_loss"].get<double>(), s1["val_loss"].get<double>(), 1e-5) << "the same validation set";
  // Rank 0 alone writes: one log line per step, one checkpoint.
  std::ifstream log(out("two") + "/train_log.jsonl");
  int lines = 0;
  for (std::string l; std::getline(log, l);) ++lines;
  EXPECT_EQ(lines, 8);
  // Blocking buckets (no overlap) and four ranks reach the same weights.
  const CliResult blocking = run_ranks(2, args("blocking", 8, 2, {"--no-overlap"}));
  ASSERT_EQ(blocking.rc, 0) << blocking.all();
  EXPECT_EQ(weights(out("blocking")), weights(out("two"))) << "overlap changes when, not what, is summed";
  const CliResult four = run_ranks(4, args("four", 8, 1, {"--bucket-kb", "4"}));
  ASSERT_EQ(four.rc, 0) << four.all();
  expect_same_weights(out("one"), out("four"));
}

// SFT targets are masked, and the ranks' rows hold different numbers of them: the loss is weighted
// by the global target count, so the update is still the one-process update on the global batch.
TEST_F(DataParallelMpi, SftWithMaskedTargetsEqualsOneProcess) {
  const CliResult one = run_ranks(0, args("sft_one", 8, 4, {}, true));
  ASSERT_EQ(one.rc, 0) << one.all();
  const CliResult two = run_ranks(2, args("sft_two", 8, 2, {}, true));
  ASSERT_EQ(two.rc, 0) << two.all();
  expect_same_weights(out("sft_one"), out("sft_two"));
  // With --grad-accum each global micro-batch is weighted by its own target count, as in one process.
  const CliResult a1 = run_ranks(0, args("accum_one", 6, 4, {"--grad-accum", "2"}, true));
  ASSERT_EQ(a1.rc, 0) << a1.all();
  const CliResult a2 = run_ranks(2, args("accum_two", 6, 2, {"--grad-accum", "2"}, true));
  ASSERT_EQ(a2.rc, 0) << a2.all();
  expect_same_weights(out("accum_one"), out("accum_two"));
  // The sampled softmax draws its candidates from the global micro-batch's targets.
  const CliResult s1 = run_ranks(0, args("sampled_one", 6, 4, {"--loss", "sampled", "--negatives", "16"}, true));
  ASSERT_EQ(s1.rc, 0) << s1.all();
  const CliResult s2 = run_ranks(2, args("sampled_two", 6, 2, {"--loss", "sampled", "--negatives", "16"}, true));
  ASSERT_EQ(s2.rc, 0) << s2.all();
  expect_same_weights(out("sampled_one"), out("sampled_two"));
}

// The checkpoint holds the global data position: 2 ranks to step 5, then 1 process with the same
// global batch to step 10, equals 10 uninterrupted steps (and the other way round).
TEST_F(DataParallelMpi, ResumeWithADifferentRankCountContinues) {
  const CliResult ref = run_ranks(0, args("ref", 10, 4));
  ASSERT_EQ(ref.rc, 0) << ref.all();
  CliResult r = run_ranks(2, args("2then1", 10, 2, {"--stop-at", "5"}));
  ASSERT_EQ(r.rc, 0) << r.all();
  r = run_ranks(0, args("2then1", 10, 4, {"--resume"}));
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_EQ(summary(r)["start_step"], 5);
  expect_same_weights(out("ref"), out("2then1"));
  r = run_ranks(0, args("1then2", 10, 4, {"--stop-at", "5"}));
  ASSERT_EQ(r.rc, 0) << r.all();
  r = run_ranks(2, args("1then2", 10, 2, {"--resume"}));
  ASSERT_EQ(r.rc, 0) << r.all();
  expect_same_weights(out("ref"), out("1then2"));
}

TEST_F(DataParallelMpi, ChecksumCatchesADivergedRank) {
  const CliResult r = run_ranks(2, args("diverged", 12, 2, {"--checksum-every", "2", "--save-every", "100"}),
                                {"CORELM_TEST_PERTURB_REPLICA=1:3"}, 30);
  EXPECT_FALSE(r.timed_out) << "a mismatch must end the job, not hang it";
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("weights diverged at step 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 differs from rank 0"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out("diverged") + "/checkpoints/latest")) << "nothing is saved after a mismatch";
  // A malformed knob is an error naming it, not ignored.
  const CliResult bad = run_ranks(2, args("badknob", 2, 2), {"CORELM_TEST_PERTURB_REPLICA=one"}, 30);
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("CORELM_TEST_PERTURB_REPLICA"), std::string::npos) << bad.err;
}

TEST_F(DataParallelMpi, OutOfRangeOptionsAreErrorsNamingThem) {
  CliResult r = run_ranks(0, args("badbucket", 2, 2, {"--bucket-kb", "0"}));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--bucket-kb"), std::string::npos) << r.err;
  r = run_ranks(2, args("badchecksum", 2, 2, {"--checksum-every", "-1"}), {}, 30);
  EXPECT_NE(r.rc, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("--checksum-every"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out("badchecksum") + "/train_log.jsonl")) << "nothing written for a bad option";
}

TEST_F(DataParallelMpi, BenchAllreducePrintsLatencyAndBandwidthBySize) {
  CliOptions o;
  o.timeout_s = 60;
  o.env = mpi_env();
  const CliResult r = run_program(
      "mpirun", {"-np", "2", "--oversubscribe", corelm::testing::corelm_path(), "bench", "allreduce", "--json",
                 "--seconds", "0.005", "--min-kib", "4", "--max-mib", "1"},
      o);
  ASSERT_EQ(r.rc, 0) << r.all();
  const nlohmann::json j = summary(r);
  EXPECT_EQ(j["ranks"], 2);
  ASSERT_EQ(j["points"].size(), 9u) << "4 KiB .. 1 MiB by powers of two";
  for (const auto& p : j["points"]) {
    EXPECT_GT(p["latency_us"].get<double>(), 0);
    EXPECT_GT(p["iallreduce_us"].get<double>(), 0);
    EXPECT_GT(p["algbw_gb_s"].get<double>(), 0);
  }
  EXPECT_GE(j["suggested_bucket_bytes"].get<int64_t>(), 4096);
  // One process has nothing to measure: a clear error, not a meaningless table.
  const CliResult alone = run_ranks(0, {"bench", "allreduce"});
  EXPECT_EQ(alone.rc, 1);
  EXPECT_NE(alone.err.find("needs at least 2 MPI ranks"), std::string::npos) << alone.err;
}

// The ranks' process ids: mpirun's children, each with OMPI_COMM_WORLD_RANK in its environment.
std::map<int, pid_t> rank_pids(pid_t mpirun) {
  std::map<int, pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = s.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(s.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != mpirun) continue;
    const std::string env = slurp(e.path() / "environ");
    const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
    const size_t at = env.find(key);
    if (at != std::string::npos) out[std::stoi(env.substr(at + key.size()))] = std::stoi(name);
  }
  return out;
}

TEST_F(DataParallelMpi, AKilledRankEndsTheJobWithinSeconds) {
  const std::string log = out("killed.log");
  std::vector<std::string> env = mpi_env();
  const pid_t mpirun = corelm::testing::spawn_corelm(
      mpirun_args(2, args("killed", 1000000, 2, {"--save-every", "1000000", "--eval-every", "1000000"})), log, -1,
      env, "mpirun");
  ASSERT_GT(mpirun, 0);
  // Wait until training runs (rank 0 has logged steps), then kill rank 1 as a node failure would.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::map<int, pid_t> ranks;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(out("killed") + "/train_log.jsonl");
    int lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    ranks = rank_pids(mpirun);
    if (lines >= 3 && ranks.count(0) && ranks.count(1)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ranks.count(0) && ranks.count(1)) << "the ranks never started: " << slurp(log);
  ASSERT_EQ(::kill(ranks[1], SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(mpirun, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) {  // a hang: clean up, then fail
    for (const auto& [r, pid] : rank_pids(mpirun)) ::kill(pid, SIGKILL);
    ::kill(mpirun, SIGKILL);
    ::waitpid(mpirun, &status, 0);
    FAIL() << "the job still ran 30 s after rank 1 died: " << slurp(log);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(log);
  EXPECT_LT(seconds, 30);
  // Rank 0 is gone too (not left behind, blocked in a collective).
  const std::string rank0 = "/proc/" + std::to_string(ranks[0]);
  const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (fs::exists(rank0) && slurp(rank0 + "/stat").find(") Z") == std::string::npos &&
         std::chrono::steady_clock::now() < grace)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(!fs::exists(rank0) || slurp(rank0 + "/stat").find(") Z") != std::string::npos) << "rank 0 still runs";
}

// SIGTERM to mpirun reaches every rank; the ranks agree on the step to stop after, rank 0
// checkpoints it, and --resume continues from there.
TEST_F(DataParallelMpi, SigtermToMpirunCheckpointsTheSameStepOnEveryRank) {
  const std::string log = out("sigterm.log");
  const pid_t mpirun = corelm::testing::spawn_corelm(
      mpirun_args(2, args("sigterm", 1000000, 2, {"--save-every", "1000000", "--eval-every", "1000000"})), log, -1,
      mpi_env(), "mpirun");
  ASSERT_GT(mpirun, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int lines = 0;
  while (std::chrono::steady_clock::now() < until && lines < 3) {
    std::ifstream in(out("sigterm") + "/train_log.jsonl");
    lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(lines, 3) << slurp(log);
  ASSERT_EQ(::kill(mpirun, SIGTERM), 0);
  int status = 0;
  pid_t done = 0;
  const auto killed_at = std::chrono::steady_clock::now();
  while ((done = ::waitpid(mpirun, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) {
    for (const auto& [r, pid] : rank_pids(mpirun)) ::kill(pid, SIGKILL);
    ::kill(mpirun, SIGKILL);
    ::waitpid(mpirun, &status, 0);
    FAIL() << "the job still ran 30 s after SIGTERM: " << slurp(log);
  }
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "an interrupted run is not a finished one";
  const std::string text = slurp(log);
  EXPECT_NE(text.find("\"stopped_by_signal\":\"SIGTERM\""), std::string::npos) << text;
  const std::string ck = latest_checkpoint(out("sigterm"));
  ASSERT_FALSE(ck.empty()) << text;
  const int64_t step = nlohmann::json::parse(slurp(ck + "/trainer_state.json")).at("step").get<int64_t>();
  EXPECT_GE(step, 3);
  EXPECT_EQ(nlohmann::json::parse(slurp(ck + "/trainer_state.json")).at("rows_drawn").get<int64_t>(), 4 * step)
      << "the global data position: 2 ranks x 2 rows per step";
}

}  // namespace
}  // namespace corelm::train
