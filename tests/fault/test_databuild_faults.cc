// Bad input to `corelm data build` through the real binary: a missing or unreadable input, a
// damaged .gz named by file and byte offset, empty input, out-of-range options, and a full disk.
// Each must exit 1 with one clear line and leave no corpus file (or temp file) behind.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/cli_runner.h"
#include "common/gzip.h"

namespace corelm::testing {
namespace {
namespace fs = std::filesystem;

std::string prose(int seed) {
  static const char* words[] = {"the",    "of",      "and",    "river", "mountain", "village", "winter", "garden",
                                "walked", "carried", "bright", "stone", "bridge",   "market",  "with",   "was"};
  std::string s = "The";
  uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 1;
  for (int i = 1; i < 50; ++i) {
    x = x * 1664525u + 1013904223u;
    s += std::string(" ") + words[(x >> 16) % 16] + (i % 10 == 9 ? "." : "");
  }
  return s + ".";
}

class DataBuildFaults : public ::testing::Test {
 protected:
  ScratchDir dir_{"databuild_faults"};
  void write(const std::string& name, const std::string& bytes) { std::ofstream(dir_ / name, std::ios::binary) << bytes; }
  CliResult build(std::vector<std::string> extra, const CliOptions& opt = CliOptions{60}) {
    std::vector<std::string> args{"data", "build", "--out", dir_ / "out/corpus.bin", "--vocab-size", "300",
                                  "--no-progress"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_corelm(args, opt);
  }
  void SetUp() override {
    fs::create_directories(dir_ / "out");
    std::string text;
    for (int i = 0; i < 20; ++i) text += prose(i) + "\n\n";
    write("good.txt", text);
  }
  // The output folder must hold nothing: no corpus, no temp, spill or sample file.
  void expect_no_output() {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_ / "out")) names.insert(e.path().filename().string());
    EXPECT_TRUE(names.empty()) << "left behind: " << *names.begin();
  }
};

TEST_F(DataBuildFaults, ABuildPrintsItsReportAndTrainsFromTheFiles) {
  const CliResult r = build({"--from", dir_ / "good.txt", "--json", "--val-fraction", "0.1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["paragraphs_in"], 20);
  EXPECT_EQ(j["paragraphs_kept"], 20);
  EXPECT_GT(j["train_tokens"].get<int64_t>(), 0);
  EXPECT_GT(j["val_tokens"].get<int64_t>(), 0);
  for (const char* rule : {"exact_duplicate", "near_duplicate", "letters", "stopwords", "line_ends"})
    EXPECT_TRUE(j["dropped"].contains(rule)) << rule;
  EXPECT_TRUE(fs::exists(dir_ / "out/corpus.val.bin.json"));
}

TEST_F(DataBuildFaults, AMissingInputIsNamed) {
  const CliResult r = build({"--from", dir_ / "good.txt", dir_ / "nope.txt"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--from " + (dir_ / "nope.txt") + ": No such file or directory"), std::string::npos) << r.err;
  expect_no_output();
}

TEST_F(DataBuildFaults, AnUnreadableInputIsNamed) {
  // A FIFO cannot be read as a file (nothing may ever write to it): refused unread.
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  CliResult r = build({"--from", dir_ / "fifo"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("fifo: not a regular file"), std::string::npos) << r.err;
  expect_no_output();
  // Permissions: root reads everything, so this half runs only for other users.
  write("secret.txt", prose(1) + "\n");
  ::chmod((dir_ / "secret.txt").c_str(), 0);
  if (::geteuid() != 0) {
    r = build({"--from", dir_ / "secret.txt"});
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("secret.txt: cannot open: Permission denied"), std::string::npos) << r.err;
    expect_no_output();
  }
}

TEST_F(DataBuildFaults, ACorruptGzipIsNamedByFileAndOffset) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += prose(100 + i) + "\n\n";
  std::string gz = gzip(text);
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i) gz[i] = static_cast<char>(gz[i] ^ 0xA5);
  write("bad.txt.gz", gz);
  CliResult r = build({"--from", dir_ / "good.txt", dir_ / "bad.txt.gz"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("bad.txt.gz: corrupt gzip data near byte "), std::string::npos) << r.err;
  expect_no_output();
  write("cut.txt.gz", gzip(text).substr(0, gz.size() / 3));
  r = build({"--from", dir_ / "cut.txt.gz"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cut.txt.gz: truncated gzip stream: the file ends at byte"), std::string::npos) << r.err;
  expect_no_output();
}

TEST_F(DataBuildFaults, EmptyInputIsAClearError) {
  write("empty.txt", "");
  fs::create_directories(dir_ / "emptydir");
  for (const std::string& in : {dir_ / "empty.txt", dir_ / "emptydir"}) {
    const CliResult r = build({"--from", in});
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("corelm: error: data build: the inputs hold no text"), std::string::npos) << r.err;
    expect_no_output();
  }
}

TEST_F(DataBuildFaults, OptionsOutOfRangeAreNamed) {
  for (const char* v : {"-0.5", "0.9", "nan"}) {
    const CliResult r = build({"--from", dir_ / "good.txt", "--val-fraction", v});
    EXPECT_EQ(r.rc, 1) << v;
    EXPECT_NE(r.err.find("--val-fraction must be in [0, 0.5]"), std::string::npos) << r.err;
  }
  CliResult r = build({"--from", dir_ / "good.txt", "--min-chars", "-1"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--min-chars must be >= 0"), std::string::npos) << r.err;
  r = build({"--from", dir_ / "good.txt", "--near-dup-threshold", "0"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--near-dup-threshold"), std::string::npos) << r.err;
  r = build({"--from", dir_ / "good.txt", "--threads", "0"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("thread"), std::string::npos) << r.err;
  r = run_corelm({"data", "build", "--from", dir_ / "good.txt"}, CliOptions{30});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.all().find("--out"), std::string::npos) << r.all();
  expect_no_output();
}

TEST_F(DataBuildFaults, AFullDiskFailsWithoutAPartialCorpus) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += prose(1000 + i) + "\n\n";
  write("big.txt", text);
  CliOptions opt{60};
  opt.fsize_limit = 20000;  // the token file (and the spill) outgrow it
  const CliResult r = build({"--from", dir_ / "big.txt"}, opt);
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  expect_no_output();
}

}  // namespace
}  // namespace corelm::testing
