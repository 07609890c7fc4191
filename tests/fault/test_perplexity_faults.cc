// `corelm perplexity --save-logits` is all or nothing (issue 18): killed at any write, rename or
// fsync, the base file at the target path is either the previous one, byte for byte, or the whole
// new one -- never a prefix a later --kl-base run would read as a shorter, different base -- and
// whichever is there still works as a base.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/cli_runner.h"
#include "common/process_limits.h"

namespace fs = std::filesystem;
using corelm::testing::CliOptions;
using corelm::testing::CliResult;
using corelm::testing::run_corelm;
using corelm::testing::run_program;
using corelm::testing::ScratchDir;

namespace corelm {
namespace {

constexpr bool kSanitized = corelm::testing::kAddressSanitizer;
const fs::path kStories = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data" / "models" / "stories260K";
const std::string kBin = (kStories / "stories260K.bin").string();
const std::string kTok = (kStories / "tok512.bin").string();

CliOptions within(double seconds) {
  CliOptions o;
  o.timeout_s = seconds;
  return o;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A few hundred tokens of story text; `variant` changes the words, so two runs' files differ.
std::string story(int variant) {
  const char* names[] = {"Lily", "Tom"};
  std::string s;
  for (int i = 0; i < 40; ++i)
    s += std::string("Once upon a time, ") + names[variant] + " went to the park with a red ball number " +
         std::to_string(i * (variant + 3)) + ". ";
  return s;
}

TEST(PerplexityFaults, SaveLogitsKilledAnywhereLeavesTheOldOrTheNewBaseFile) {
  if (!fs::exists(corelm::testing::corelm_path())) GTEST_SKIP() << "corelm not built (target corelm_cli)";
  if (!fs::exists(kBin) || !fs::exists(kTok)) GTEST_SKIP() << "stories260K absent under " << kStories.string();
  if (!corelm::testing::have_program("strace")) GTEST_SKIP() << "strace not installed (apt-get install strace)";
  ScratchDir d("perplexity_save_kill");
  for (int v : {0, 1}) std::ofstream(d / ("text" + std::to_string(v) + ".txt")) << story(v);
  auto args = [&](int text, const std::string& out) {
    return std::vector<std::string>{"perplexity", "--model", kBin, "--tokenizer", kTok, "-f",
                                    d / ("text" + std::to_string(text) + ".txt"), "--ctx", "64", "--precision", "f32",
                                    "--save-logits", out};
  };
  CliResult r0 = run_corelm(args(0, d / "old.bin"), within(60));
  ASSERT_EQ(r0.rc, 0) << r0.all();
  CliResult r1 = run_corelm(args(1, d / "new.bin"), within(60));
  ASSERT_EQ(r1.rc, 0) << r1.all();
  const std::string old_bytes = slurp(d / "old.bin"), new_bytes = slurp(d / "new.bin");
  ASSERT_NE(old_bytes, new_bytes);
  ASSERT_GT(new_bytes.size(), 100000u) << "the file should take many writes";

  int runs = 0, killed = 0, saw_old = 0, saw_new = 0;
  auto attempt = [&](const std::string& inject) {
    ++runs;
    fs::copy_file(d / "old.bin", d / "target.bin", fs::copy_options::overwrite_existing);
    std::vector<std::string> full = {"-f", "-qq", "-o", "/dev/null", "-e", "inject=" + inject,
                                     corelm::testing::corelm_path()};
    for (const auto& a : args(1, d / "target.bin")) full.push_back(a);
    CliResult r = run_program("strace", full, within(60));
    EXPECT_FALSE(r.timed_out) << inject;
    const std::string now = slurp(d / "target.bin");
    const bool is_old = now == old_bytes, is_new = now == new_bytes;
    EXPECT_TRUE(is_old || is_new) << "after " << inject << " (rc " << r.rc << ") the base file is neither the old nor "
                                  << "the new one (" << now.size() << " bytes)\n" << r.err;
    if (r.rc == 0) EXPECT_TRUE(is_new) << inject;
    killed += r.rc == 128 + SIGKILL;
    saw_old += is_old;
    saw_new += is_new;
    return r.rc == 128 + SIGKILL;
  };
  for (const auto& [calls, step] : std::vector<std::pair<std::string, int>>{
           {"write", kSanitized ? 7 : 2}, {"rename,renameat,renameat2", 1}, {"fsync,fdatasync", 1}})
    for (int n = 1; n < 400 && attempt(calls + ":signal=KILL:when=" + std::to_string(n)); n += step) {
    }
  std::printf("[ faults   ] %d runs, %d killed: %d left the old base file, %d the new one\n", runs, killed, saw_old,
              saw_new);
  EXPECT_GT(killed, 5) << "the fault injection did not kill perplexity";
  EXPECT_GT(saw_old, 0);
  EXPECT_GT(saw_new, 0);
  // What a kill leaves is a usable base: the old file still compares against text 0.
  std::vector<std::string> kl = args(0, "");
  kl.resize(kl.size() - 2);
  kl.insert(kl.end(), {"--kl-base", d / "old.bin", "--json"});
  CliResult k = run_corelm(kl, within(60));
  EXPECT_EQ(k.rc, 0) << k.all();
  EXPECT_NE(k.out.find("\"mean_kld\""), std::string::npos) << k.out;
}

}  // namespace
}  // namespace corelm
