// `corelm run batch` as a user runs it (the real binary): its output lines equal what the server
// of `corelm serve` (serve::Server, in-process here) answers for the same bodies on
// /v1/completions; kill -9 at random moments and a rerun give the same output as an
// uninterrupted run, every custom_id exactly once; an invalid input fails whole, naming its
// lines, before anything is queued; --overwrite semantics.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "corelm/queue.h"
#include "corelm/serve.h"
#include "serve/serve_fixture.h"

namespace corelm::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::CliOptions;
using testing::run_corelm;

// Lines of a batch input: greedy rows, rows with their own seed, and rows that sample with the
// row's derived seed (no "seed": only a rerun of the same row can reproduce them).
std::string make_input(int n, const std::string& model, int max_tokens, uint32_t seed = 3) {
  std::mt19937 rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    json body = {{"model", model}, {"prompt", testing::serve_words(rng, 3 + static_cast<int>(rng() % 6))},
                 {"max_tokens", 1 + static_cast<int>(rng() % max_tokens)}};
    switch (i % 3) {
      case 0: body["temperature"] = 0; break;
      case 1: body["temperature"] = 0.9; body["seed"] = 100 + i; break;
      default: body["temperature"] = 0.8; break;
    }
    json line = {{"custom_id", "req-" + std::to_string(i)}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}};
    out += line.dump() + "\n";
  }
  return out;
}

void write(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

std::vector<json> read_lines(const fs::path& p) {
  std::vector<json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// An output line without what legitimately differs between two folders (the response's
// "created": the time the folder's first run started).
json comparable(json line) {
  if (line["response"].is_object() && line["response"]["body"].is_object()) line["response"]["body"].erase("created");
  return line;
}

class RunBatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new testing::ScratchDir("run_batch");
    testing::make_model_dir(root_->path() / "tiny");
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static std::string model() { return (root_->path() / "tiny").string(); }
  // --max-attempts 10: a kill -9 while a row runs counts as one of its attempts.
  static std::vector<std::string> args(const fs::path& input, const fs::path& out, const std::string& slots = "4") {
    return {"run", "batch", "--model", model(), "--input", input.string(), "--out", out.string(), "--slots", slots,
            "--max-attempts", "10", "--json"};
  }
  static testing::ScratchDir* root_;
};
testing::ScratchDir* RunBatchTest::root_ = nullptr;

TEST_F(RunBatchTest, OutputEqualsServerCompletionsPerLine) {
  const fs::path dir = root_->path() / "equal";
  fs::create_directories(dir);
  const std::string input = make_input(24, "tiny", 12);
  write(dir / "in.jsonl", input);
  auto r = run_corelm(args(dir / "in.jsonl", dir / "out"), CliOptions{60});
  ASSERT_EQ(r.rc, 0) << r.all();
  const json summary = json::parse(r.out);
  EXPECT_EQ(summary["total"], 24);
  EXPECT_EQ(summary["completed"], 24);
  EXPECT_EQ(summary["run_now"], 24);
  const auto out = read_lines(dir / "out" / "output.jsonl");
  ASSERT_EQ(out.size(), 24u);
  EXPECT_TRUE(read_lines(dir / "out" / "errors.jsonl").empty());

  ServeOptions so;
  so.models = {model()};
  so.port = 0;
  so.slots = 4;
  Server server(so);
  const int port = server.bind();
  std::thread t([&] { server.serve(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(20, 0);
  for (int i = 0; i < 500 && !server.ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::istringstream in(input);
  std::string line;
  int i = 0, compared = 0;
  for (; std::getline(in, line); ++i) {
    const json req = json::parse(line);
    const json& o = out[i];
    EXPECT_EQ(o["custom_id"], req["custom_id"]);
    EXPECT_EQ(o["id"].get<std::string>().rfind("batch_req_", 0), 0u);
    EXPECT_TRUE(o["error"].is_null());
    EXPECT_EQ(o["response"]["status_code"], 200);
    const json& body = o["response"]["body"];
    EXPECT_EQ(body["object"], "text_completion");
    EXPECT_EQ(body["model"], "tiny");
    // Rows without a seed sample with the row's own seed: the server draws a random one.
    if (!req["body"].contains("seed") && req["body"]["temperature"] != 0) continue;
    auto res = c.Post("/v1/completions", req["body"].dump(), "application/json");
    ASSERT_TRUE(res) << "line " << i + 1;
    ASSERT_EQ(res->status, 200) << res->body;
    const json want = json::parse(res->body);
    EXPECT_EQ(body["choices"], want["choices"]) << "line " << i + 1;
    EXPECT_EQ(body["usage"], want["usage"]) << "line " << i + 1;
    ++compared;
  }
  EXPECT_EQ(compared, 16);
  server.shutdown();
  t.join();
}

TEST_F(RunBatchTest, KillNineThreeTimesThenResumeEqualsUninterrupted) {
  const int n = 400;
  const fs::path dir = root_->path() / "kill";
  fs::create_directories(dir);
  write(dir / "in.jsonl", make_input(n, "tiny", 24, 5));
  auto ref = run_corelm(args(dir / "in.jsonl", dir / "ref"), CliOptions{60});
  ASSERT_EQ(ref.rc, 0) << ref.all();
  const auto want = read_lines(dir / "ref" / "output.jsonl");
  ASSERT_EQ(want.size(), static_cast<size_t>(n));

  // Three random moments of the run, as rows done (a clock would be at the mercy of the load):
  // each process is killed once the journal holds its target.
  std::mt19937 rng(2026);
  std::vector<int64_t> targets;
  for (int k = 0; k < 3; ++k) targets.push_back(n / 10 + static_cast<int64_t>(rng() % (8 * n / 10)));
  std::sort(targets.begin(), targets.end());
  const std::string qpath = queue::queue_path((dir / "run").string());
  std::optional<queue::Queue> q;
  for (int k = 0; k < 3; ++k) {
    const pid_t pid = testing::spawn_corelm(args(dir / "in.jsonl", dir / "run"), (dir / "run.log").string());
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      if (!q && fs::exists(dir / "run" / "batch.json") && fs::exists(qpath)) q.emplace(queue::Queue::open(qpath));
      if (q && q->counts().done >= targets[k]) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ::kill(pid, SIGKILL);
    EXPECT_EQ(testing::wait_exit(pid), 128 + SIGKILL) << "kill " << k << " came after the end";
    EXPECT_FALSE(fs::exists(dir / "run" / "output.jsonl")) << "kill " << k << " came after the end";
  }
  ASSERT_TRUE(q.has_value());
  // Rows finished before the kills are not run again.
  const int64_t done_before = q->counts().done;
  EXPECT_GE(done_before, targets[2]);
  EXPECT_LT(done_before, n);
  q.reset();
  auto r = run_corelm(args(dir / "in.jsonl", dir / "run"), CliOptions{60});
  ASSERT_EQ(r.rc, 0) << r.all();
  const json summary = json::parse(r.out);
  EXPECT_TRUE(summary["resumed"].get<bool>());
  EXPECT_EQ(summary["run_now"].get<int64_t>(), n - done_before);
  const auto got = read_lines(dir / "run" / "output.jsonl");
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  std::set<std::string> ids;
  for (size_t i = 0; i < got.size(); ++i) {
    ids.insert(got[i]["custom_id"].get<std::string>());
    EXPECT_EQ(comparable(got[i]), comparable(want[i])) << "line " << i + 1;
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(n));
  EXPECT_TRUE(read_lines(dir / "run" / "errors.jsonl").empty());

  // A rerun of a finished folder runs nothing and writes the same files.
  const std::string before = testing::slurp(dir / "run" / "output.jsonl");
  auto again = run_corelm(args(dir / "in.jsonl", dir / "run"), CliOptions{60});
  ASSERT_EQ(again.rc, 0) << again.all();
  EXPECT_EQ(json::parse(again.out)["run_now"], 0);
  EXPECT_EQ(testing::slurp(dir / "run" / "output.jsonl"), before);
}

TEST_F(RunBatchTest, InvalidLinesFailTheWholeFileNamingEachLine) {
  const fs::path dir = root_->path() / "bad";
  fs::create_directories(dir);
  std::string input = make_input(2, "tiny", 4);
  input += "{not json\n";                                                                        // line 3
  input += R"({"custom_id":"req-0","method":"POST","url":"/v1/completions","body":{"prompt":"a"}})" "\n";  // 4: duplicate
  input += R"({"custom_id":"x5","method":"POST","url":"/v1/embeddings","body":{"input":"a"}})" "\n";      // 5: url
  input += R"({"custom_id":"x6","method":"POST","url":"/v1/completions","body":{"model":"gpt-9","prompt":"a"}})" "\n";  // 6
  input += R"({"method":"POST","url":"/v1/completions","body":{"prompt":"a"}})" "\n";                     // 7: no custom_id
  write(dir / "in.jsonl", input);
  auto r = run_corelm(args(dir / "in.jsonl", dir / "out"), CliOptions{60});
  EXPECT_NE(r.rc, 0);
  const std::string file = (dir / "in.jsonl").string();
  for (int line : {3, 4, 5, 6, 7}) EXPECT_NE(r.err.find(file + ":" + std::to_string(line) + ":"), std::string::npos) << line << "\n" << r.err;
  EXPECT_EQ(r.err.find(file + ":1:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("duplicate_custom_id"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("5 invalid lines"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out" / "queue.sqlite"));

  write(dir / "empty.jsonl", "\n\n");
  auto e = run_corelm(args(dir / "empty.jsonl", dir / "out2"), CliOptions{60});
  EXPECT_NE(e.rc, 0);
  EXPECT_NE(e.err.find("no requests"), std::string::npos) << e.err;
  auto missing = run_corelm(args(dir / "absent.jsonl", dir / "out3"), CliOptions{60});
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("absent.jsonl"), std::string::npos) << missing.err;
}

TEST_F(RunBatchTest, AnotherInputIsRefusedUnlessOverwrite) {
  const fs::path dir = root_->path() / "overwrite";
  fs::create_directories(dir);
  write(dir / "a.jsonl", make_input(6, "tiny", 4, 1));
  std::string b = make_input(4, "tiny", 4, 2);
  for (size_t p = 0; (p = b.find("\"req-", p)) != std::string::npos; p += 5) b.replace(p, 5, "\"bbb-");
  write(dir / "b.jsonl", b);
  ASSERT_EQ(run_corelm(args(dir / "a.jsonl", dir / "out"), CliOptions{60}).rc, 0);
  auto refused = run_corelm(args(dir / "b.jsonl", dir / "out"), CliOptions{60});
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.err.find("--overwrite"), std::string::npos) << refused.err;
  EXPECT_EQ(read_lines(dir / "out" / "output.jsonl").size(), 6u);  // untouched

  auto a = args(dir / "b.jsonl", dir / "out");
  a.push_back("--overwrite");
  auto r = run_corelm(a, CliOptions{60});
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto lines = read_lines(dir / "out" / "output.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  for (const auto& l : lines) EXPECT_EQ(l["custom_id"].get<std::string>().rfind("bbb-", 0), 0u) << l;

  // A damaged batch.json: refused, naming it; --overwrite starts over.
  write(dir / "out" / "batch.json", "{\"format\": 7");
  auto damaged = run_corelm(args(dir / "b.jsonl", dir / "out"), CliOptions{60});
  EXPECT_NE(damaged.rc, 0);
  EXPECT_NE(damaged.err.find("batch.json"), std::string::npos) << damaged.err;
  write(dir / "out" / "batch.json", "{\"format\": 7}");
  damaged = run_corelm(args(dir / "b.jsonl", dir / "out"), CliOptions{60});
  EXPECT_NE(damaged.rc, 0);
  EXPECT_NE(damaged.err.find("--overwrite"), std::string::npos) << damaged.err;
  ASSERT_EQ(run_corelm(a, CliOptions{60}).rc, 0);
  EXPECT_EQ(read_lines(dir / "out" / "output.jsonl").size(), 4u);

  // A queue file that no run batch made is not taken over either.
  fs::create_directories(dir / "foreign");
  { queue::Queue::open(queue::queue_path((dir / "foreign").string())).enqueue("m", "{}"); }
  auto f = run_corelm(args(dir / "a.jsonl", dir / "foreign"), CliOptions{60});
  EXPECT_NE(f.rc, 0);
  EXPECT_NE(f.err.find("queue.sqlite"), std::string::npos) << f.err;
}

TEST_F(RunBatchTest, ShardsConcatenateToTheWholeRun) {
  const fs::path dir = root_->path() / "shards";
  fs::create_directories(dir);
  write(dir / "in.jsonl", make_input(11, "tiny", 6, 8));
  ASSERT_EQ(run_corelm(args(dir / "in.jsonl", dir / "whole"), CliOptions{60}).rc, 0);
  const auto whole = read_lines(dir / "whole" / "output.jsonl");
  std::vector<json> joined;
  for (int i = 0; i < 3; ++i) {
    auto a = args(dir / "in.jsonl", dir / ("shard-" + std::to_string(i)));
    a.insert(a.end(), {"--shard", std::to_string(i) + "/3"});
    auto r = run_corelm(a, CliOptions{60});
    ASSERT_EQ(r.rc, 0) << r.all();
    EXPECT_GE(json::parse(r.out)["total"].get<int>(), 3);
    for (auto& l : read_lines(dir / ("shard-" + std::to_string(i)) / "output.jsonl")) joined.push_back(l);
  }
  ASSERT_EQ(joined.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(joined[i]["custom_id"], whole[i]["custom_id"]);
    EXPECT_EQ(joined[i]["response"]["body"]["choices"], whole[i]["response"]["body"]["choices"]) << i;
  }
  auto a = args(dir / "in.jsonl", dir / "bad");
  a.insert(a.end(), {"--shard", "3/3"});
  auto bad = run_corelm(a, CliOptions{60});
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--shard"), std::string::npos) << bad.err;
}

TEST_F(RunBatchTest, BadOptionsNameTheOption) {
  const fs::path dir = root_->path() / "opts";
  fs::create_directories(dir);
  write(dir / "in.jsonl", make_input(2, "tiny", 4));
  auto r = run_corelm(args(dir / "in.jsonl", dir / "out", "0"), CliOptions{60});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--slots"), std::string::npos) << r.err;
  auto a = args(dir / "in.jsonl", dir / "out");
  a.insert(a.end(), {"--queue-sync", "sometimes"});
  r = run_corelm(a, CliOptions{60});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--queue-sync"), std::string::npos) << r.err;

  // A model that is missing or does not load leaves no journal: the rerun with the right model
  // needs no --overwrite.
  a = args(dir / "in.jsonl", dir / "out");
  a[3] = (dir / "missing" / "tiny").string();
  r = run_corelm(a, CliOptions{60});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("missing/tiny: no such file"), std::string::npos) << r.err;
  fs::create_directories(dir / "broken" / "tiny");  // the same model id, a folder that does not load
  write(dir / "broken" / "tiny" / "config.json", "{}");
  a[3] = (dir / "broken" / "tiny").string();
  r = run_corelm(a, CliOptions{60});
  EXPECT_NE(r.rc, 0);
  EXPECT_FALSE(fs::exists(dir / "out" / "queue.sqlite")) << r.err;
  a[3] = model();
  r = run_corelm(a, CliOptions{60});
  EXPECT_EQ(r.rc, 0) << r.all();
}

}  // namespace
}  // namespace corelm::serve
