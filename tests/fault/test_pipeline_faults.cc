// Fault and bad-input regressions of `corelm run` (issue 13): damaged compressed inputs, two runs
// racing on one --out, a planner killed holding its lock, strings that are not UTF-8, task-file
// type errors, empty --regex/--stop. Each drives the library or the real binary with a time limit.
#include <gtest/gtest.h>
#include <sys/file.h>
#include <zlib.h>
#include <zstd.h>

#include "common/cli_runner.h"
#include "corelm/durable.h"
#include "corelm/error.h"
#include "pipeline/pipeline_fixture.h"

namespace corelm::testing {
namespace {

class PipelineFaultTest : public PipelineTest {
 protected:
  std::vector<std::string> classify_args(const std::string& input, const std::string& out,
                                         const std::string& labels = "sports,business") const {
    return {"run", "classify", "--model", model_, "--input", input, "--out", out, "--labels", labels,
            "--chunk-records", "16"};
  }
};

std::string gzip_bytes(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string zstd_bytes(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

CliOptions limit(double seconds) {
  CliOptions o;
  o.timeout_s = seconds;
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- defect 2: a damaged compressed input is an error naming the file and the byte ----------

TEST_F(PipelineFaultTest, TruncatedGzipFailsTheRunNamingFileAndOffset) {
  const std::string gz = gzip_bytes(corpus_jsonl(200, 20, 3));
  write_text(path("cut.jsonl.gz"), gz.substr(0, gz.size() / 2));
  const CliResult r = run_corelm(classify_args(path("cut.jsonl.gz"), path("out")), limit(60));
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find(path("cut.jsonl.gz") + ": truncated gzip stream: the file ends at byte " +
                       std::to_string(gz.size() / 2)),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(path("out") + "/manifest.json"));  // never "complete"
}

TEST_F(PipelineFaultTest, GzipTrailingGarbageIsRefusedButMembersAndZeroPaddingRead) {
  const std::string a = corpus_jsonl(30, 10, 4), b = corpus_jsonl(20, 10, 5);
  write_text(path("multi.jsonl.gz"), gzip_bytes(a) + gzip_bytes(b) + std::string(512, '\0'));
  auto o = classify_options(path("multi.jsonl.gz"), path("multi"));
  const auto s = pipeline::run(o);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.records, 50);

  const std::string gz = gzip_bytes(a);
  write_text(path("junk.jsonl.gz"), gz + "this is not gzip\n");
  auto j = classify_options(path("junk.jsonl.gz"), path("junk"));
  const std::string err = error_of([&] { pipeline::run(j); });
  EXPECT_NE(err.find(path("junk.jsonl.gz") + ": unexpected data after the end of the gzip stream at byte " +
                     std::to_string(gz.size())),
            std::string::npos)
      << err;
  // Garbage after zero padding too.
  write_text(path("junk2.jsonl.gz"), gz + std::string(8, '\0') + "x");
  auto j2 = classify_options(path("junk2.jsonl.gz"), path("junk2"));
  EXPECT_NE(error_of([&] { pipeline::run(j2); }).find("unexpected data after the end"), std::string::npos);
  // A damaged byte inside the deflate data.
  std::string bad = gz;
  bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x55);
  write_text(path("flip.jsonl.gz"), bad);
  auto f = classify_options(path("flip.jsonl.gz"), path("flip"));
  EXPECT_NE(error_of([&] { pipeline::run(f); }).find(path("flip.jsonl.gz") + ": corrupt gzip data near byte"),
            std::string::npos);
}

TEST_F(PipelineFaultTest, TruncatedAndTrailingZstdReportTheOffsetLikeGzip) {
  const std::string z = zstd_bytes(corpus_jsonl(200, 20, 6));
  write_text(path("cut.jsonl.zst"), z.substr(0, z.size() / 2));
  auto o = classify_options(path("cut.jsonl.zst"), path("cut"));
  const std::string err = error_of([&] { pipeline::run(o); });
  EXPECT_NE(err.find(path("cut.jsonl.zst") + ": truncated zstd stream: the file ends at byte " +
                     std::to_string(z.size() / 2)),
            std::string::npos)
      << err;
  write_text(path("junk.jsonl.zst"), z + "garbage!");
  auto j = classify_options(path("junk.jsonl.zst"), path("junk"));
  EXPECT_NE(error_of([&] { pipeline::run(j); }).find(path("junk.jsonl.zst") + ": corrupt zstd data near byte " +
                                                     std::to_string(z.size())),
            std::string::npos);
}

// ---- defect 3: two runs of different tasks on one --out --------------------------------------

TEST_F(PipelineFaultTest, ConcurrentRunsOfDifferentTasksOnOneOutOneIsRefused) {
  write_text(path("in.jsonl"), corpus_jsonl(120, 10, 7));
  for (int round = 0; round < 6; ++round) {  // a few tries: the race is not hit every time
    const std::string out = path("out" + std::to_string(round));
    const pid_t a = spawn_corelm(classify_args(path("in.jsonl"), out, "sports,business"), path("a.log"));
    const pid_t b = spawn_corelm(classify_args(path("in.jsonl"), out, "world,sci"), path("b.log"));
    const int ra = wait_exit(a), rb = wait_exit(b);
    const std::string la = slurp(path("a.log")), lb = slurp(path("b.log"));
    ASSERT_EQ((ra == 0) + (rb == 0), 1) << "a: " << la << "\nb: " << lb;
    const std::string& loser = ra == 0 ? lb : la;
    EXPECT_NE(loser.find("holds the output of another run: task 'classify' (labels "), std::string::npos) << loser;
    EXPECT_NE(loser.find("they differ in: labels"), std::string::npos) << loser;
    // Every part holds the winner's labels only.
    const std::string winner = ra == 0 ? "sports" : "world";
    const auto lines = parse_lines(read_parts(out));
    EXPECT_EQ(lines.size(), 120u);
    for (const auto& l : lines) EXPECT_TRUE(l["probs"].contains(winner)) << l.dump();
    const auto manifest = nlohmann::json::parse(slurp(out + "/manifest.json"));
    EXPECT_EQ(manifest["task"]["labels"][0], winner);
  }
}

TEST_F(PipelineFaultTest, OverwriteIsRefusedWhileAnotherRunStillWrites) {
  write_text(path("in.jsonl"), corpus_jsonl(20, 8, 8));
  auto o = classify_options(path("in.jsonl"), path("out"));
  pipeline::run(o);
  // A live writer of the first run holds OUT/run.active shared, as every running process does.
  const int fd = ::open((path("out") + "/run.active").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);
  auto other = o;
  other.task.labels = {"a", "b"};
  other.overwrite = true;
  const std::string err = error_of([&] { pipeline::run(other); });
  EXPECT_NE(err.find("--overwrite refused: another run (task 'classify' (labels sports,business,world,sci)"),
            std::string::npos)
      << err;
  // The same run may still join (a restart, another shard) while it writes.
  EXPECT_EQ(pipeline::run(o).chunks_run, 0);
  ::close(fd);
  EXPECT_EQ(pipeline::run(other).records, 20);
}

// ---- defect 4: a planner killed with its lock ------------------------------------------------

TEST_F(PipelineFaultTest, PlannerKilledHoldingPlanLockDoesNotBlockTheNextRun) {
  write_text(path("in.jsonl"), corpus_jsonl(40, 8, 9));
  fs::create_directories(path("out"));
  const std::string lock = path("out") + "/plan.lock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto held = FileLock::try_acquire(lock);
    const char c = held ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(fs::exists(lock));  // the dead holder's lock file stays behind
  const CliResult r = run_corelm(classify_args(path("in.jsonl"), path("out")), limit(30));
  EXPECT_FALSE(r.timed_out) << "run waited on the dead planner's lock: " << r.all();
  EXPECT_EQ(r.rc, 0) << r.all();
  EXPECT_TRUE(fs::exists(path("out") + "/plan.json"));
  EXPECT_FALSE(fs::exists(lock));
}

TEST_F(PipelineFaultTest, RunKilledWhilePlanningLeavesNoLockThatBlocks) {
  if (!have_program("strace")) GTEST_SKIP() << "strace not installed";
  write_text(path("in.jsonl"), corpus_jsonl(40, 8, 15));
  // FileLock writes its holder record with pwrite: the 1st is run.lock's, the 2nd plan.lock's,
  // so the kill lands while this run holds the plan lock.
  std::vector<std::string> args = classify_args(path("in.jsonl"), path("out"));
  args.insert(args.begin(), {"-f", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64", "-e",
                             "inject=pwrite64:signal=KILL:when=2", corelm_path()});
  const CliResult killed = run_program("strace", args, limit(30));
  if (killed.rc != 128 + SIGKILL && fs::exists(path("out") + "/plan.json"))
    GTEST_SKIP() << "strace could not inject here: " << killed.all();
  ASSERT_TRUE(fs::exists(path("out") + "/plan.lock")) << killed.all();
  ASSERT_FALSE(fs::exists(path("out") + "/plan.json"));
  const CliResult r = run_corelm(classify_args(path("in.jsonl"), path("out")), limit(30));
  EXPECT_FALSE(r.timed_out) << r.all();
  EXPECT_EQ(r.rc, 0) << r.all();
  EXPECT_TRUE(fs::exists(path("out") + "/manifest.json"));
}

// ---- defect 11: strings that are not UTF-8 ---------------------------------------------------

TEST_F(PipelineFaultTest, NonUtf8FileNamesAreEscapedInEveryJsonOutput) {
  const std::string in = path("in\xff.jsonl");
  write_text(in, corpus_jsonl(10, 6, 10) + "{\"text\": \"caf\xff\"}\n");
  const std::string model = path("model\xfe");
  fs::create_directory_symlink(model_, model);
  std::vector<std::string> args = classify_args(in, path("out"));
  args[3] = model;
  args.push_back("--json");
  for (int pass = 0; pass < 2; ++pass) {  // the second pass reads the cached plan.json back
    const CliResult r = run_corelm(args, limit(60));
    ASSERT_EQ(r.rc, 0) << r.all();
    EXPECT_EQ(r.all().find("type_error"), std::string::npos) << r.all();
    const auto manifest = nlohmann::json::parse(r.out);
    EXPECT_EQ(manifest["inputs"][0], path("in\\xFF.jsonl"));
    EXPECT_EQ(manifest["model"], path("model\\xFE"));
    EXPECT_EQ(manifest["records"], 10);
    EXPECT_EQ(manifest["errors"], 1);
  }
  const auto errors = parse_lines(read_parts(path("out"), "errors-"));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["file"], path("in\\xFF.jsonl"));
  EXPECT_EQ(errors[0]["reason"], "invalid UTF-8 (byte 0xFF at byte 13 of the line); JSON lines must be UTF-8");
  EXPECT_NO_THROW(nlohmann::json::parse(slurp(path("out") + "/run.json")));
  EXPECT_NO_THROW(nlohmann::json::parse(slurp(path("out") + "/plan.json")));
  // Default ids (FILE:LINE) in the parts are escaped too.
  write_text(path("noid\xff.jsonl"), "{\"text\": \"the cat\"}\n");
  auto o = classify_options(path("noid\xff.jsonl"), path("noid"));
  pipeline::run(o);
  const auto parts = parse_lines(read_parts(path("noid")));
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0]["id"], path("noid\\xFF.jsonl") + ":1");
}

TEST_F(PipelineFaultTest, NonUtf8LabelsTemplatesAndFieldsAreRefusedNamingTheOption) {
  write_text(path("in.jsonl"), corpus_jsonl(4, 6, 11));
  const CliResult label = run_corelm(classify_args(path("in.jsonl"), path("a"), "ok,bad\xff"), limit(60));
  EXPECT_EQ(label.rc, 1);
  EXPECT_NE(label.err.find("--labels label is not valid UTF-8 (byte 0xFF at offset 3)"), std::string::npos)
      << label.err;
  auto args = classify_args(path("in.jsonl"), path("b"));
  args.insert(args.end(), {"--template", "{text}\xff"});
  const CliResult tmpl = run_corelm(args, limit(60));
  EXPECT_EQ(tmpl.rc, 1);
  EXPECT_NE(tmpl.err.find("--template is not valid UTF-8"), std::string::npos) << tmpl.err;
  auto o = classify_options(path("in.jsonl"), path("c"));
  o.task.text_field = "te\xffxt";
  EXPECT_NE(error_of([&] { pipeline::run(o); }).find("--text-field is not valid UTF-8"), std::string::npos);
  write_text(path("task.json"), "{\"template\": \"{text}\\nLabel\xff:\"}");
  auto t = classify_args(path("in.jsonl"), path("d"));
  t.insert(t.end(), {"--task", path("task.json")});
  const CliResult task = run_corelm(t, limit(60));
  EXPECT_EQ(task.rc, 1);
  EXPECT_EQ(task.all().find("type_error"), std::string::npos) << task.all();
}

// ---- defect 16: task-file type errors name the key; the context error names real options -----

TEST_F(PipelineFaultTest, TaskFileTypeErrorsNameTheKeyAndTheType) {
  auto msg = [](const char* text) {
    return error_of([&] { pipeline::TaskSpec::from_json(nlohmann::json::parse(text)); });
  };
  EXPECT_EQ(msg(R"({"labels": "a,b"})"), "task file key \"labels\" must be an array of strings, got string");
  EXPECT_EQ(msg(R"({"labels": ["a", 2]})"), "task file key \"labels\"[1] must be a string, got number");
  EXPECT_EQ(msg(R"({"max_tokens": "8"})"), "task file key \"max_tokens\" must be an integer, got string");
  EXPECT_EQ(msg(R"({"max_context": 1.5})"), "task file key \"max_context\" must be an integer, got number");
  EXPECT_EQ(msg(R"({"label_eos": 1})"), "task file key \"label_eos\" must be true or false, got number");
  EXPECT_EQ(msg(R"({"stop": 3})"), "task file key \"stop\" must be a string or an array of strings, got number");
  EXPECT_EQ(msg(R"([1])"), "task file: expected a JSON object, got array");
  // Through the CLI, the message also names the file.
  write_text(path("in.jsonl"), corpus_jsonl(4, 6, 12));
  write_text(path("task.json"), R"({"template": 7})");
  auto args = classify_args(path("in.jsonl"), path("out"));
  args.insert(args.end(), {"--task", path("task.json")});
  const CliResult r = run_corelm(args, limit(60));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--task " + path("task.json") + ": task file key \"template\" must be a string, got number"),
            std::string::npos)
      << r.err;
}

TEST_F(PipelineFaultTest, ClassifyContextErrorNamesOnlyClassifyOptions) {
  write_text(path("in.jsonl"), corpus_jsonl(4, 6, 13));
  auto o = classify_options(path("in.jsonl"), path("out"));
  o.task.template_text = "a long instruction that does not fit into the context at all {text}";
  o.task.max_context = 8;
  const std::string err = error_of([&] { pipeline::run(o); });
  EXPECT_NE(err.find("raise --max-context, shorten --template or --labels"), std::string::npos) << err;
  EXPECT_EQ(err.find("--max-tokens"), std::string::npos) << err;
}

// ---- defect 17: empty --regex / --stop -------------------------------------------------------

TEST_F(PipelineFaultTest, EmptyRegexAndStopAreRefused) {
  write_text(path("in.jsonl"), corpus_jsonl(4, 6, 14));
  const std::vector<std::string> base{"run", "extract", "--model", model_, "--input", path("in.jsonl"), "--out",
                                      path("out")};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_corelm(args, limit(60));
  };
  const CliResult regex = with({"--regex", ""});
  EXPECT_EQ(regex.rc, 1);
  EXPECT_NE(regex.err.find("--regex: empty pattern"), std::string::npos) << regex.all();
  const CliResult stop = with({"--stop", ""});
  EXPECT_EQ(stop.rc, 1);
  EXPECT_NE(stop.err.find("--stop: empty stop string"), std::string::npos) << stop.all();
  const CliResult stop2 = with({"--stop", "\n", "--stop", ""});
  EXPECT_EQ(stop2.rc, 1);
  write_text(path("task.json"), R"({"task": "extract", "regex": ""})");
  const CliResult file = with({"--task", path("task.json")});
  EXPECT_EQ(file.rc, 1);
  EXPECT_NE(file.err.find("--regex: empty pattern"), std::string::npos) << file.all();
  EXPECT_FALSE(fs::exists(path("out") + "/run.json"));  // refused before anything is written
}

}  // namespace
}  // namespace corelm::testing

namespace corelm::testing {
namespace {

// eval-task's input (issue 14): bad gold data is a clear error naming the line, never a score
// over part of the data; a damaged compressed input fails as `run` does.
TEST_F(PipelineFaultTest, EvalTaskRefusesBadGoldDataNamingTheLine) {
  auto eval = [&](const std::string& data, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"eval-task", "--model", model_, "--data", data, "--labels", "sports,business"};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_corelm(a, limit(60));
  };
  write_text(path("good.jsonl"), "{\"text\": \"the team won\", \"label\": \"sports\"}\n{\"text\": \"prices fell\", \"label\": \"business\"}\n");
  const CliResult ok = eval(path("good.jsonl"), {"--json"});
  ASSERT_EQ(ok.rc, 0) << ok.all();
  EXPECT_EQ(nlohmann::json::parse(ok.out)["records"], 2);

  write_text(path("unknown.jsonl"), "{\"text\": \"a\", \"label\": \"sports\"}\n{\"text\": \"b\", \"label\": \"world\"}\n");
  CliResult r = eval(path("unknown.jsonl"));
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("unknown.jsonl:2: gold label 'world' is not one of --labels"), std::string::npos) << r.err;

  write_text(path("nolabel.jsonl"), "{\"text\": \"a\"}\n");
  r = eval(path("nolabel.jsonl"));
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("nolabel.jsonl:1: no gold label field 'label'"), std::string::npos) << r.err;

  write_text(path("empty.jsonl"), "");
  r = eval(path("empty.jsonl"));
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("no labelled record"), std::string::npos) << r.err;

  r = eval(path("good.jsonl"), {"--labels", "sports,sports"});
  EXPECT_EQ(r.rc, 1) << r.all();

  // A cut gzip: the error of the reader, naming the file and offset.
  std::string big;
  for (int i = 0; i < 300; ++i) big += "{\"text\": \"the team won game " + std::to_string(i) + "\", \"label\": \"sports\"}\n";
  write_text(path("g.jsonl"), big);
  ASSERT_EQ(std::system(("gzip -kf " + path("g.jsonl")).c_str()), 0);
  const std::string gz = slurp(path("g.jsonl.gz"));
  write_text(path("cut.jsonl.gz"), gz.substr(0, gz.size() / 2));
  r = eval(path("cut.jsonl.gz"));
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("truncated gzip stream"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace corelm::testing
