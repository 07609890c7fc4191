// The persistent queue of `corelm serve --state-dir` under faults, against the real binary on
// loopback: a 2,000-request batch survives kill -9 of the server at 10 random moments (every
// custom_id exactly once, every body equal to an uninterrupted run's: the offline `corelm run
// batch` of the same file); two servers share one state dir and the one killed -9 mid-batch loses
// its leases at once (the survivor finishes without waiting --lease-seconds); a full disk (a
// small tmpfs when this machine lets us mount one, else --max-state-bytes) answers 507 for new
// work, keeps serving /health and interactive completions, loses nothing, and the batch completes
// once there is room; a truncated, foreign or random-bytes queue.sqlite stops the server with a
// message naming the file. Each test is bounded.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sqlite3.h>
#include <sys/mount.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "corelm/queue.h"
#include "serve/serve_fixture.h"

namespace corelm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::ServerProcess;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A batch input of `n` lines: greedy, seeded and unseeded-sampled rows of 1..3 tokens.
std::string batch_input(int n, uint32_t seed = 9) {
  std::mt19937 rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    json body = {{"model", "tiny"}, {"prompt", testing::serve_words(rng, 2 + static_cast<int>(rng() % 4))},
                 {"max_tokens", 1 + static_cast<int>(rng() % 3)}};
    if (i % 3 == 0) body["temperature"] = 0;
    if (i % 3 == 1) body["seed"] = i;
    out += json({{"custom_id", "c" + std::to_string(i)}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}})
               .dump() +
           "\n";
  }
  return out;
}

// New queued work larger than the room left (SQLite fills partial pages first, so a tiny enqueue
// may still fit when the results no longer do).
json big_generate() {
  json prompts = json::array();
  for (int i = 0; i < 1000; ++i) prompts.push_back("the cat sat on the mat " + std::to_string(i) + std::string(200, 'x'));
  return {{"prompts", prompts}, {"max_tokens", 2}};
}

std::vector<json> parse_lines(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

class QueueFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("corelm_queue_faults_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    testing::make_model_dir(root_ / "tiny");
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string model() { return (root_ / "tiny").string(); }
  static fs::path path(const std::string& name) {
    return root_ / (::testing::UnitTest::GetInstance()->current_test_info()->name() + ("_" + name));
  }
  static std::vector<std::string> serve_args(const fs::path& state, std::vector<std::string> extra = {}) {
    std::vector<std::string> a{"--model", model(), "--state-dir", state.string(), "--slots", "8", "--queue-sync",
                               "normal", "--max-attempts", "100"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static httplib::Client client(int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2, 0);
    c.set_read_timeout(20, 0);
    return c;
  }
  // Storage full: /health and interactive completions still answer, new queued work is a 507.
  static void expect_serving_but_no_room(int port) {
    auto c = client(port);
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    auto comp = c.Post("/v1/completions", json({{"prompt", "the cat"}, {"max_tokens", 3}}).dump(), "application/json");
    ASSERT_TRUE(comp);
    EXPECT_EQ(comp->status, 200) << comp->body;
    auto gen = c.Post("/v1/generate", big_generate().dump(), "application/json");
    ASSERT_TRUE(gen);
    EXPECT_EQ(gen->status, 507) << gen->body;
  }

  static bool wait_healthy(int port, double timeout_s = 20) {
    auto c = client(port);
    const auto start = Clock::now();
    while (since(start) < timeout_s) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Starts a server on the state dir and waits until it serves; the port, or -1.
  static int start(std::unique_ptr<ServerProcess>& s, const fs::path& state, const std::string& log,
                   std::vector<std::string> extra = {}) {
    s = std::make_unique<ServerProcess>(serve_args(state, std::move(extra)), path(log));
    const int port = s->wait_port();
    if (port < 0 || !wait_healthy(port)) return -1;
    return port;
  }
  // POST /v1/files (purpose=batch) then /v1/batches; the batch id ("" on failure, with the
  // answers in *why).
  static std::string submit_batch(int port, const std::string& input, std::string* why) {
    auto c = client(port);
    httplib::MultipartFormDataItems items = {{"purpose", "batch", "", ""},
                                             {"file", input, "input.jsonl", "application/jsonl"}};
    auto f = c.Post("/v1/files", items);
    if (!f || f->status != 200) {
      *why = "files: " + (f ? std::to_string(f->status) + " " + f->body : std::string("no answer"));
      return "";
    }
    const json file = json::parse(f->body);
    const json req = {{"input_file_id", file["id"]}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}};
    auto b = c.Post("/v1/batches", req.dump(), "application/json");
    if (!b || b->status != 200) {
      *why = "batches: " + (b ? std::to_string(b->status) + " " + b->body : std::string("no answer"));
      return "";
    }
    return json::parse(b->body)["id"].get<std::string>();
  }
  static json get_batch(int port, const std::string& id) {
    auto r = client(port).Get(("/v1/batches/" + id).c_str());
    if (!r || r->status != 200) return json();
    return json::parse(r->body, nullptr, false);
  }
  // Counters of one /metrics answer (-1 when absent).
  static std::vector<int64_t> metrics(int port, const std::vector<std::string>& names) {
    auto r = client(port).Get("/metrics");
    std::vector<int64_t> out;
    for (const auto& name : names) {
      const size_t at = r ? r->body.find("\n" + name + " ") : std::string::npos;
      out.push_back(at == std::string::npos ? -1 : std::stoll(r->body.substr(at + name.size() + 2)));
    }
    return out;
  }
  static int64_t metric(int port, const std::string& name) { return metrics(port, {name})[0]; }
  static int64_t completed(const json& b) {
    if (!b.is_object() || !b.contains("request_counts")) return -1;
    return b["request_counts"].value("completed", int64_t(0)) + b["request_counts"].value("failed", int64_t(0));
  }
  // Polls until the batch is completed (or failed/cancelled/expired); the final object, or null
  // at the timeout.
  static json wait_batch(int port, const std::string& id, double timeout_s) {
    const auto start = Clock::now();
    while (since(start) < timeout_s) {
      json b = get_batch(port, id);
      const std::string st = b.is_object() ? b.value("status", "") : "";
      if (st == "completed" || st == "failed" || st == "cancelled" || st == "expired") return b;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return json();
  }
  static std::string file_content(int port, const json& id) {
    if (!id.is_string()) return "";
    auto r = client(port).Get(("/v1/files/" + id.get<std::string>() + "/content").c_str());
    return r && r->status == 200 ? r->body : std::string();
  }
  // The offline run of the same file: the uninterrupted reference, custom_id -> body.
  static std::map<std::string, json> reference(const std::string& input) {
    static std::map<std::string, std::map<std::string, json>> cache;
    if (cache.count(input)) return cache[input];
    const fs::path dir = root_ / ("ref_" + std::to_string(cache.size()));
    fs::create_directories(dir);
    { std::ofstream(dir / "in.jsonl") << input; }
    auto r = testing::run_corelm({"run", "batch", "--model", model(), "--input", (dir / "in.jsonl").string(), "--out",
                                  (dir / "out").string(), "--slots", "8", "--queue-sync", "normal"},
                                 testing::CliOptions{60});
    EXPECT_EQ(r.rc, 0) << r.all();
    std::map<std::string, json> out;
    for (const json& l : parse_lines(testing::slurp(dir / "out" / "output.jsonl")))
      out[l["custom_id"].get<std::string>()] = l["response"]["body"];
    return cache[input] = out;
  }
  // Every custom_id of the input exactly once in output + errors, and each output body's
  // choices equal to the reference's.
  static void expect_exactly_once(const std::string& input, const std::string& output, const std::string& errors) {
    const auto want = reference(input);
    const auto out = parse_lines(output), err = parse_lines(errors);
    EXPECT_TRUE(err.empty()) << errors.substr(0, 2000);
    std::map<std::string, int> seen;
    for (const auto& l : out) ++seen[l["custom_id"].get<std::string>()];
    for (const auto& l : err) ++seen[l["custom_id"].get<std::string>()];
    size_t lines = 0;
    for (const auto& l : parse_parts(input)) {
      ++lines;
      EXPECT_EQ(seen[l], 1) << l;
    }
    EXPECT_EQ(seen.size(), lines);
    EXPECT_EQ(out.size() + err.size(), lines);
    int diffs = 0;
    for (const auto& l : out) {
      const std::string cid = l["custom_id"].get<std::string>();
      ASSERT_TRUE(want.count(cid)) << cid;
      const json& body = l["response"]["body"];
      if (body["choices"] != want.at(cid)["choices"] && diffs++ < 5)
        ADD_FAILURE() << cid << ": " << body["choices"].dump() << " vs uninterrupted " << want.at(cid)["choices"].dump();
    }
    EXPECT_EQ(diffs, 0);
  }
  static std::vector<std::string> parse_parts(const std::string& input) {
    std::vector<std::string> ids;
    for (const auto& l : parse_lines(input)) ids.push_back(l["custom_id"].get<std::string>());
    return ids;
  }

  static fs::path root_;
};
fs::path QueueFaults::root_;

TEST_F(QueueFaults, BatchSurvivesTenKillNineAtRandomMoments) {
  // Enough rows that ten restarts fit inside the run on a fast core too: each restart finishes a few
  // hundred rows before the first status read (about 300 on an AMX Xeon guest, where 2,000 rows
  // left 3 of 10 kills after the end in 3 of 15 runs).
  const int n = 4000;
  const std::string input = batch_input(n);
  const fs::path state = path("state");
  fs::create_directories(state);
  reference(input);  // before the clock starts: the comparison run
  std::unique_ptr<ServerProcess> s;
  int port = start(s, state, "0.log");
  ASSERT_GT(port, 0) << s->log();
  std::string why;
  const std::string id = submit_batch(port, input, &why);
  ASSERT_FALSE(id.empty()) << why;

  // Ten moments spread over the run: kill when the completed count passes each target (random,
  // sorted), so some kills land early, some late, some mid-ack.
  std::mt19937 rng(16);
  std::vector<int64_t> targets;
  for (int k = 0; k < 10; ++k) targets.push_back(static_cast<int64_t>(rng() % (n - 100)));
  std::sort(targets.begin(), targets.end());
  const auto t0 = Clock::now();
  int kills = 0, mid_run = 0;
  std::vector<int64_t> at_kill;
  for (int k = 0; k < 10; ++k) {
    if (k > 0) {
      port = start(s, state, std::to_string(k) + ".log");
      ASSERT_GT(port, 0) << s->log();
    }
    const auto start_k = Clock::now();
    int64_t c = 0;
    while (since(start_k) < 20) {
      c = completed(get_batch(port, id));
      if (c >= targets[k] || c >= n) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // A little random extra so the kill does not always follow a status read.
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
    s->kill(SIGKILL);
    ++kills;
    if (c < n) ++mid_run;
    at_kill.push_back(c);
    ASSERT_LT(since(t0), 45) << "the kill loop took too long";
  }
  EXPECT_EQ(kills, 10);
  std::string counts;
  for (int64_t c : at_kill) counts += std::to_string(c) + " ";
  EXPECT_GE(mid_run, 8) << "rows done at each kill: " << counts;
  std::cerr << "[ note ] rows done at the 10 kills: " << counts << "\n";
  port = start(s, state, "final.log");
  ASSERT_GT(port, 0) << s->log();
  const json b = wait_batch(port, id, 40);
  ASSERT_TRUE(b.is_object()) << "the batch did not finish; last: " << get_batch(port, id).dump();
  EXPECT_EQ(b["status"], "completed") << b.dump();
  EXPECT_EQ(b["request_counts"]["total"], n);
  EXPECT_EQ(b["request_counts"]["completed"], n);
  expect_exactly_once(input, file_content(port, b["output_file_id"]), file_content(port, b["error_file_id"]));
}

TEST_F(QueueFaults, TwoServersShareTheStateDirAndTheSurvivorFinishesAtOnce) {
  const int n = 800;
  const std::string input = batch_input(n, 21);
  const fs::path state = path("state");
  fs::create_directories(state);
  reference(input);
  // --lease-seconds 600: only the dead-process rule can give the killed server's rows back in time.
  std::unique_ptr<ServerProcess> a, b;
  const int pa = start(a, state, "a.log", {"--lease-seconds", "600"});
  const int pb = start(b, state, "b.log", {"--lease-seconds", "600"});
  ASSERT_GT(pa, 0) << a->log();
  ASSERT_GT(pb, 0) << b->log();
  std::string why;
  const std::string id = submit_batch(pa, input, &why);
  ASSERT_FALSE(id.empty()) << why;
  const auto t0 = Clock::now();
  while (since(t0) < 20 && completed(get_batch(pb, id)) < n / 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int64_t at_kill = completed(get_batch(pb, id));
  const auto a_counts = metrics(pa, {"corelm_queue_leased_total", "corelm_queue_completed_total"});
  const int64_t a_leased = a_counts[0], a_done = a_counts[1];
  a->kill(SIGKILL);
  EXPECT_LT(at_kill, n) << "the batch ended before the kill";
  // The killed server held rows (leased, not acked) and had done part of the batch.
  EXPECT_GT(a_leased, a_done) << "the killed server held no lease";
  EXPECT_GT(a_done, 0);
  const auto t1 = Clock::now();
  const json fin = wait_batch(pb, id, 40);
  ASSERT_TRUE(fin.is_object()) << "the survivor did not finish; last: " << get_batch(pb, id).dump();
  EXPECT_LT(since(t1), 40) << "waited for a lease to expire?";
  EXPECT_EQ(fin["status"], "completed") << fin.dump();
  expect_exactly_once(input, file_content(pb, fin["output_file_id"]), file_content(pb, fin["error_file_id"]));
  EXPECT_TRUE(b->running());
  EXPECT_GT(metric(pb, "corelm_queue_completed_total"), 0);
  // The survivor acked only rows the killed one had not (a_done may be short of the killed
  // server's last acks, which came after it was read).
  EXPECT_LE(metric(pb, "corelm_queue_completed_total") + a_done, n) << "a row acked twice";
}

// A tmpfs of a few MB as the state dir: real ENOSPC from the kernel. Skipped (and the
// --max-state-bytes test below stands in) where mounting is not allowed.
class TmpfsMount {
 public:
  TmpfsMount(const fs::path& dir, const std::string& size) : dir_(dir) {
    fs::create_directories(dir);
    ok_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
  }
  ~TmpfsMount() {
    if (ok_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool ok() const { return ok_; }

 private:
  fs::path dir_;
  bool ok_ = false;
};

// Fills `dir` with a file until writes fail, leaving about `leave` bytes; returns its path.
fs::path fill(const fs::path& dir, size_t leave) {
  const fs::path f = dir / "filler";
  std::ofstream out(f, std::ios::binary);
  std::string block(4096, 'x');
  while (out.write(block.data(), static_cast<std::streamsize>(block.size()))) out.flush();
  out.close();
  // Give back `leave` bytes so that the server can still write a little (not only at 0).
  std::error_code ec;
  const auto size = fs::file_size(f, ec);
  if (!ec && size > leave) fs::resize_file(f, size - leave, ec);
  return f;
}

TEST_F(QueueFaults, DiskFullDuringResultWritesThen507AndNothingLost) {
  const fs::path state = path("tmpfs");
  TmpfsMount mnt(state, "6m");
  if (!mnt.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                              << "); DiskCapDuringResultWrites covers the bounded-storage case";
  const int n = 1500;
  const std::string input = batch_input(n, 33);
  reference(input);
  std::unique_ptr<ServerProcess> s;
  int port = start(s, state, "0.log");
  ASSERT_GT(port, 0) << s->log();
  std::string why;
  const std::string id = submit_batch(port, input, &why);
  ASSERT_FALSE(id.empty()) << why;
  const fs::path filler = fill(state, 0);
  // The disk is full: results cannot be stored; the server goes on serving what needs no disk.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_NO_FATAL_FAILURE(expect_serving_but_no_room(port));
  const int64_t stuck = completed(get_batch(port, id));
  EXPECT_LT(stuck, n);
  // Room again: the batch completes, each row once.
  fs::remove(filler);
  json b = wait_batch(port, id, 40);
  ASSERT_TRUE(b.is_object()) << "the batch did not finish after space was freed; last: " << get_batch(port, id).dump()
                             << "\n" << s->log().substr(0, 3000);
  EXPECT_EQ(b["status"], "completed") << b.dump();
  expect_exactly_once(input, file_content(port, b["output_file_id"]), file_content(port, b["error_file_id"]));
}

TEST_F(QueueFaults, DiskCapDuringResultWritesThen507AndRestartWithMoreRoomFinishes) {
  const int n = 600;
  const std::string input = batch_input(n, 44);
  reference(input);
  const fs::path state = path("state");
  fs::create_directories(state);
  // Upload and create under no cap, then restart under a cap just above the file's size: the
  // result writes hit the cap part way through the batch.
  std::unique_ptr<ServerProcess> s;
  int port = start(s, state, "0.log");
  ASSERT_GT(port, 0) << s->log();
  std::string why;
  const std::string id = submit_batch(port, input, &why);
  ASSERT_FALSE(id.empty()) << why;
  s->kill(SIGKILL);
  const auto db = fs::file_size(queue::queue_path(state.string()));
  port = start(s, state, "1.log", {"--max-state-bytes", std::to_string(db + 64 * 1024)});
  ASSERT_GT(port, 0) << s->log();
  const auto t0 = Clock::now();
  int64_t last = -1, same = 0;
  while (since(t0) < 20 && same < 20) {  // until progress stops (the cap) for ~1 s
    const int64_t c = completed(get_batch(port, id));
    same = c == last ? same + 1 : 0;
    last = c;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LT(last, n) << "the cap was never reached";
  ASSERT_NO_FATAL_FAILURE(expect_serving_but_no_room(port));
  s->kill(SIGKILL);
  port = start(s, state, "2.log");
  ASSERT_GT(port, 0) << s->log();
  const json b = wait_batch(port, id, 40);
  ASSERT_TRUE(b.is_object()) << "the batch did not finish after the cap was raised; last: " << get_batch(port, id).dump();
  EXPECT_EQ(b["status"], "completed") << b.dump();
  expect_exactly_once(input, file_content(port, b["output_file_id"]), file_content(port, b["error_file_id"]));
}

TEST_F(QueueFaults, CorruptOrForeignQueueFileStopsTheServerNamingIt) {
  auto expect_refused = [&](const fs::path& state, const std::string& what) {
    ServerProcess s(serve_args(state), path(what + ".log"));
    const int rc = s.wait_exit(30);
    const std::string log = s.log();
    EXPECT_NE(rc, 0) << what << ": " << log;
    EXPECT_NE(rc, -1) << what << ": still running after 30 s";
    EXPECT_NE(log.find(queue::queue_path(state.string())), std::string::npos) << what << ": " << log;
  };
  {  // truncated: a real queue cut to half its size
    const fs::path state = path("truncated");
    fs::create_directories(state);
    {
      auto q = queue::Queue::open(queue::queue_path(state.string()));
      for (int i = 0; i < 200; ++i) q.enqueue("tiny", json({{"prompt", std::string(200, 'a' + i % 26)}}).dump());
    }
    const std::string f = queue::queue_path(state.string());
    fs::remove(f + "-wal");
    fs::remove(f + "-shm");
    fs::resize_file(f, fs::file_size(f) / 2);
    expect_refused(state, "truncated");
  }
  {  // another application's SQLite database
    const fs::path state = path("foreign");
    fs::create_directories(state);
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(queue::queue_path(state.string()).c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE songs(id INTEGER PRIMARY KEY, title TEXT); INSERT INTO songs VALUES(1,'x');",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
    expect_refused(state, "foreign");
  }
  {  // random bytes
    const fs::path state = path("random");
    fs::create_directories(state);
    std::mt19937 rng(5);
    std::string bytes(64 * 1024, '\0');
    for (auto& ch : bytes) ch = static_cast<char>(rng());
    std::ofstream(queue::queue_path(state.string()), std::ios::binary) << bytes;
    expect_refused(state, "random");
  }
}

}  // namespace
}  // namespace corelm
