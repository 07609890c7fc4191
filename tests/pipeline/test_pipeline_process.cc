// The real `corelm run` binary as a child process: SIGKILL at random moments then a rerun gives
// the uninterrupted output; 2 MPI ranks give the 1-process output; a full disk is a clear error
// and the rerun after freeing space completes with nothing lost.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

#include "pipeline_fixture.h"

namespace corelm::testing {
namespace {

class PipelineProcessTest : public PipelineTest {
 protected:
  void SetUp() override {
    if (!fs::exists(corelm_path())) GTEST_SKIP() << corelm_path() << " is not built (build target corelm_cli)";
    PipelineTest::SetUp();
  }
  std::vector<std::string> classify_args(const std::string& input, const std::string& out) const {
    return {"run", "classify", "--model", model_, "--input", input, "--text-field", "text",
            "--labels", "sports,business,world,sci", "--out", out, "--chunk-records", "10", "--batch", "8"};
  }
  int run_to_end(const std::vector<std::string>& args, const std::string& log) {
    return wait_exit(spawn_corelm(args, log));
  }
  static std::vector<std::string> tmp_files(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
    return out;
  }
};

TEST_F(PipelineProcessTest, KilledRunsResumeToTheUninterruptedOutput) {
  write_text(path("in.jsonl"), corpus_jsonl(600, 40, 21));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run_to_end(classify_args(path("in.jsonl"), path("ref")), path("ref.log")), 0) << slurp(path("ref.log"));
  const double full_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string reference = read_parts(path("ref"));
  ASSERT_EQ(parse_lines(reference).size(), 600u);

  // Each attempt resumes where the previous one was killed. It is killed once it has committed
  // at least one more chunk, after a short random delay (0-5% of a full run), so the kill lands
  // while chunks are still being committed whatever the machine's load (a fixed fraction of the
  // full run's time could land before the first commit on a loaded machine).
  std::mt19937 rng(1234);
  int killed = 0;
  std::vector<size_t> committed;
  auto records_now = [&] { return fs::exists(path("out")) ? parse_lines(read_parts(path("out"))).size() : 0; };
  for (int k = 0; k < 5; ++k) {
    const size_t before = records_now();
    const pid_t pid = spawn_corelm(classify_args(path("in.jsonl"), path("out")), path("kill.log"));
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (records_now() <= before && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    const double frac = 0.05 * (rng() % 1000) / 1000.0;
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int>(full_ms * frac * 1000)));
    ::kill(pid, SIGKILL);
    killed += wait_exit(pid) == 128 + SIGKILL;
    committed.push_back(fs::exists(path("out")) ? parse_lines(read_parts(path("out"))).size() : 0);
  }
  EXPECT_EQ(killed, 5) << "every kill should land while the run is going (full run: " << full_ms << " ms)";
  EXPECT_LT(committed.back(), 600u) << "the kills should leave work to resume";
  EXPECT_GT(committed.back(), 0u) << "the killed runs should have committed some chunks";
  std::cerr << "records committed after each kill:";
  for (size_t c : committed) std::cerr << " " << c;
  std::cerr << "\n";
  ASSERT_EQ(run_to_end(classify_args(path("in.jsonl"), path("out")), path("final.log")), 0) << slurp(path("final.log"));
  const std::string resumed = read_parts(path("out"));
  EXPECT_EQ(resumed, reference);
  std::set<std::string> ids;
  for (const auto& j : parse_lines(resumed)) EXPECT_TRUE(ids.insert(j["id"].get<std::string>()).second) << j["id"];
  EXPECT_EQ(ids.size(), 600u);
  EXPECT_TRUE(tmp_files(path("out")).empty());
  const auto manifest = nlohmann::json::parse(slurp(path("out") + "/manifest.json"));
  EXPECT_EQ(manifest["records"], 600);
  EXPECT_EQ(manifest["complete"], true);
}

TEST_F(PipelineProcessTest, TwoMpiRanksEqualOneProcess) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin libopenmpi-dev)";
  write_text(path("a.jsonl"), corpus_jsonl(70, 20, 31));
  write_text(path("b.jsonl"), corpus_jsonl(50, 20, 32));
  ASSERT_EQ(run_to_end(classify_args(path("*.jsonl"), path("one")), path("one.log")), 0) << slurp(path("one.log"));
  std::vector<std::string> args{"-np", "2", "--oversubscribe", corelm_path()};
  for (const auto& a : classify_args(path("*.jsonl"), path("mpi"))) args.push_back(a);
  // Under ASan, OpenMPI's own allocations (libmpi and plugins it has already unloaded) are
  // reported as leaks at exit; leak checking of our code is done by the one-process run above.
  const int rc = wait_exit(spawn_corelm(args, path("mpi.log"),
                                        -1, {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                             "OMPI_MCA_btl=self,vader,tcp", "OMPI_MCA_btl_tcp_if_include=lo",
                                             "ASAN_OPTIONS=detect_leaks=0"},
                                        "mpirun"));
  ASSERT_EQ(rc, 0) << slurp(path("mpi.log"));
  EXPECT_EQ(read_parts(path("mpi")), read_parts(path("one")));
  const auto manifest = nlohmann::json::parse(slurp(path("mpi") + "/manifest.json"));
  EXPECT_EQ(manifest["records"], 120);
  ASSERT_EQ(manifest["ranks"].size(), 2u);
  EXPECT_GT(manifest["ranks"][0]["chunks_run"].get<double>(), 0);
  EXPECT_GT(manifest["ranks"][1]["chunks_run"].get<double>(), 0);
  EXPECT_TRUE(fs::exists(path("mpi") + "/journal-0-of-2.jsonl"));
  EXPECT_TRUE(fs::exists(path("mpi") + "/journal-1-of-2.jsonl"));
}

TEST_F(PipelineProcessTest, FullDiskIsAClearErrorAndTheRerunLosesNothing) {
  write_text(path("in.jsonl"), corpus_jsonl(100, 20, 41));
  ASSERT_EQ(run_to_end(classify_args(path("in.jsonl"), path("ref")), path("ref.log")), 0);
  const std::string reference = read_parts(path("ref"));
  // A small tmpfs when this machine allows mounting; otherwise RLIMIT_FSIZE makes writes past a
  // file size fail (EFBIG) the way a full disk does (ENOSPC).
  const std::string out = path("small");
  fs::create_directories(out);
  const bool tmpfs = std::system(("mount -t tmpfs -o size=12k tmpfs " + out + " 2>/dev/null").c_str()) == 0;
  if (tmpfs) mounts_.push_back(out);
  const pid_t pid = spawn_corelm(classify_args(path("in.jsonl"), out), path("full.log"), tmpfs ? -1 : 1000);
  EXPECT_EQ(wait_exit(pid), 1) << slurp(path("full.log"));
  const std::string log = slurp(path("full.log"));
  EXPECT_NE(log.find(tmpfs ? "No space left" : "File too large"), std::string::npos) << log;
  if (tmpfs) {
    ASSERT_EQ(std::system(("mount -o remount,size=4m " + out).c_str()), 0);
  }
  ASSERT_EQ(run_to_end(classify_args(path("in.jsonl"), out), path("rerun.log")), 0) << slurp(path("rerun.log"));
  EXPECT_EQ(read_parts(out), reference);
  std::cerr << "disk-full simulated with " << (tmpfs ? "a 12 KiB tmpfs" : "RLIMIT_FSIZE (tmpfs mount refused)") << "\n";
}

TEST_F(PipelineProcessTest, ConcurrentShardsShareOnePlanAndOneOutput) {
  // A job array starts every shard at once: one plans (plan.lock), the others wait for plan.json.
  write_text(path("in.jsonl"), corpus_jsonl(150, 20, 61));
  ASSERT_EQ(run_to_end(classify_args(path("in.jsonl"), path("full")), path("full.log")), 0) << slurp(path("full.log"));
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    auto args = classify_args(path("in.jsonl"), path("shared"));
    args.push_back("--shard");
    args.push_back(std::to_string(i) + "/3");
    pids.push_back(spawn_corelm(args, path("shard" + std::to_string(i) + ".log")));
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(wait_exit(pids[i]), 0) << slurp(path("shard" + std::to_string(i) + ".log"));
  EXPECT_EQ(read_parts(path("shared")), read_parts(path("full")));
  EXPECT_TRUE(fs::exists(path("shared") + "/plan.json"));
  EXPECT_FALSE(fs::exists(path("shared") + "/plan.lock"));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(fs::exists(path("shared") + "/journal-" + std::to_string(i) + "-of-3.jsonl"));
}

TEST_F(PipelineProcessTest, TaskFileEqualsFlagsAndJsonSummaryGoesToStdout) {
  write_text(path("in.jsonl"), corpus_jsonl(30, 10, 51));
  write_text(path("task.json"), R"({"task": "extract", "template": "Q: {text}\nA:", "choices": [" yes", " no"],
                                   "max_tokens": 8, "text_field": "text"})");
  const std::vector<std::string> common{"run", "extract", "--model", model_, "--input", path("in.jsonl"), "--json"};
  auto with = [&](std::vector<std::string> extra, const std::string& out) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--out");
    args.push_back(path(out));
    return wait_exit(spawn_corelm(args, path(out + ".log")));
  };
  ASSERT_EQ(with({"--task", path("task.json")}, "file"), 0) << slurp(path("file.log"));
  ASSERT_EQ(with({"--template", "Q: {text}\\nA:", "--choices", " yes, no", "--max-tokens", "8"}, "flags"), 0)
      << slurp(path("flags.log"));
  EXPECT_EQ(read_parts(path("file")), read_parts(path("flags")));
  const auto summary = nlohmann::json::parse(slurp(path("file.log")));
  EXPECT_EQ(summary["records"], 30);
  EXPECT_EQ(summary["task"]["template"], "Q: {text}\nA:");
  // A task file for another task is refused with a clear message.
  write_text(path("bad.json"), R"({"task": "score"})");
  EXPECT_EQ(with({"--task", path("bad.json")}, "bad"), 1);
  EXPECT_NE(slurp(path("bad.log")).find("describes a score task"), std::string::npos) << slurp(path("bad.log"));
}

}  // namespace
}  // namespace corelm::testing
