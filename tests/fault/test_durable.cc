// The durability primitives every writer uses (include/corelm/durable.h): whole-file and
// whole-folder replacement, compare-and-create, and locks that die with their holder.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/cli_runner.h"
#include "corelm/durable.h"
#include "corelm/error.h"

namespace fs = std::filesystem;
using corelm::testing::ScratchDir;

namespace {

using corelm::testing::names;
using corelm::testing::slurp;

// Runs fn in a child whose writes past `limit` bytes fail (EFBIG, as on a full disk); returns
// the child's exit code: 0 = fn threw corelm::IOError, 1 = fn returned, 2 = something else.
template <typename Fn>
int in_child_with_fsize_limit(long limit, Fn fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit r{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
    ::setrlimit(RLIMIT_FSIZE, &r);
    try {
      fn();
    } catch (const corelm::IOError&) {
      ::_exit(0);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

}  // namespace

TEST(Durable, AtomicFileFailsWholeOnDiskFullAndKeepsTheOldFile) {
  ScratchDir d("durable_full");
  const std::string target = d / "weights.bin";
  corelm::write_file_atomic(target, "old content");
  const int rc = in_child_with_fsize_limit(1000, [&] { corelm::write_file_atomic(target, std::string(5000, 'x')); });
  EXPECT_EQ(rc, 0) << "a write that hits the size limit must throw IOError";
  EXPECT_EQ(slurp(target), "old content");
  EXPECT_EQ(names(d.path()), std::vector<std::string>{"weights.bin"}) << "no temp file may be left behind";
}

TEST(Durable, StagedDirReplacesAFolderWhole) {
  ScratchDir d("durable_dir");
  const std::string target = d / "model";
  {
    corelm::StagedDir s(target);
    corelm::write_file_atomic(s.path() + "/a", "A1");
    corelm::write_file_atomic(s.path() + "/b", "B1");
    EXPECT_FALSE(fs::exists(target)) << "nothing appears before commit";
    s.commit();
  }
  EXPECT_EQ(names(target), (std::vector<std::string>{"a", "b"}));
  {
    corelm::StagedDir s(target);
    corelm::write_file_atomic(s.path() + "/c", "C2");
    EXPECT_EQ(names(target), (std::vector<std::string>{"a", "b"})) << "the old folder stays until commit";
    s.commit();
  }
  EXPECT_EQ(names(target), std::vector<std::string>{"c"});
  EXPECT_EQ(slurp(target + "/c"), "C2");
  EXPECT_EQ(names(d.path()), std::vector<std::string>{"model"}) << "no staging or old folder left beside it";
}

TEST(Durable, AnUncommittedStagedDirLeavesTheTargetAlone) {
  ScratchDir d("durable_abort");
  const std::string target = d / "out";
  fs::create_directories(target);
  corelm::write_file_atomic(target + "/keep", "K");
  try {
    corelm::StagedDir s(target, /*seed_from_target=*/true);
    EXPECT_EQ(slurp(s.path() + "/keep"), "K") << "seeded from the target";
    corelm::write_file_atomic(s.path() + "/half", "H");
    throw std::runtime_error("interrupted");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(names(target), std::vector<std::string>{"keep"});
  EXPECT_EQ(names(d.path()), std::vector<std::string>{"out"});
}

TEST(Durable, StagedDirRefusesAFileAsTarget) {
  ScratchDir d("durable_file_target");
  corelm::write_file_atomic(d / "x", "file");
  EXPECT_THROW(corelm::StagedDir s(d / "x"), corelm::IOError);
}

TEST(Durable, CreateExclusiveHasOneWinner) {
  ScratchDir d("durable_excl");
  const std::string p = d / "run.json";
  EXPECT_TRUE(corelm::create_file_exclusive(p, "first"));
  EXPECT_FALSE(corelm::create_file_exclusive(p, "second"));
  EXPECT_EQ(slurp(p), "first");
  // Many processes racing: exactly one wins, the file holds its bytes whole.
  const std::string q = d / "race.json";
  std::vector<pid_t> kids;
  for (int i = 0; i < 8; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(corelm::create_file_exclusive(q, "writer " + std::to_string(i) + std::string(4096, '.')) ? 0 : 1);
    kids.push_back(pid);
  }
  int winners = 0;
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    winners += WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  EXPECT_EQ(winners, 1);
  EXPECT_EQ(slurp(q).size(), std::string("writer 0").size() + 4096);
  EXPECT_EQ(names(d.path()), (std::vector<std::string>{"race.json", "run.json"}));
}

TEST(Durable, FileLockIsExclusiveAndNamesItsHolder) {
  ScratchDir d("durable_lock");
  const std::string p = d / "train.lock";
  auto a = corelm::FileLock::try_acquire(p);
  ASSERT_TRUE(a);
  corelm::LockHolder h;
  EXPECT_FALSE(corelm::FileLock::try_acquire(p, &h));
  EXPECT_EQ(h.pid, ::getpid());
  EXPECT_TRUE(h.alive_here());
  try {
    corelm::FileLock::acquire_or_throw(p, "train");
    ADD_FAILURE() << "a held lock was taken twice";
  } catch (const corelm::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos) << e.what();
  }
  a.reset();
  EXPECT_FALSE(fs::exists(p)) << "a released lock removes its file";
  EXPECT_TRUE(corelm::FileLock::try_acquire(p));
}

TEST(Durable, ALockDiesWithAKilledHolder) {
  ScratchDir d("durable_lock_kill");
  const std::string p = d / "plan.lock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    auto l = corelm::FileLock::try_acquire(p);
    char c = l ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  corelm::LockHolder h;
  EXPECT_FALSE(corelm::FileLock::try_acquire(p, &h));
  EXPECT_EQ(h.pid, pid);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(fs::exists(p)) << "kill -9 leaves the lock file behind";
  EXPECT_FALSE(corelm::FileLock::read_holder(p).alive_here()) << "its recorded holder is provably gone";
  EXPECT_TRUE(corelm::FileLock::try_acquire(p)) << "the lock of a dead holder is free at once";
}

#include "corelm/utf8.h"

TEST(Utf8, ValidatesEscapesAndNamesTheField) {
  EXPECT_TRUE(corelm::valid_utf8("caf\xC3\xA9 \xF0\x9F\x98\x80"));
  EXPECT_EQ(corelm::first_invalid_utf8("ab\xFF" "c"), 2u);
  EXPECT_EQ(corelm::first_invalid_utf8("\xC0\x80"), 0u) << "overlong";
  EXPECT_EQ(corelm::first_invalid_utf8("x\xED\xA0\x80"), 1u) << "surrogate";
  EXPECT_EQ(corelm::first_invalid_utf8("\xE2\x82"), 0u) << "truncated";
  EXPECT_EQ(corelm::escape_invalid_utf8("name\xFF.jsonl"), "name\\xFF.jsonl");
  try {
    corelm::require_utf8("ok\xFE", "--labels entry 2");
    ADD_FAILURE();
  } catch (const corelm::ValueError& e) {
    EXPECT_EQ(std::string(e.what()), "--labels entry 2 is not valid UTF-8 (byte 0xFE at offset 2)");
  }
}

TEST(Durable, TempNamesGiveTheirWriterAndLivenessIsChecked) {
  EXPECT_EQ(corelm::temp_writer_pid("part-00000001.jsonl.tmp.4242.7", "part-00000001.jsonl.tmp."), 4242);
  EXPECT_EQ(corelm::temp_writer_pid(".model.staging.17.0", ".model.staging."), 17);
  EXPECT_EQ(corelm::temp_writer_pid(".model.staging.17", ".model.staging."), 17);
  EXPECT_EQ(corelm::temp_writer_pid(".model.staging.x1.0", ".model.staging."), 0);
  EXPECT_EQ(corelm::temp_writer_pid(".model.staging.12a", ".model.staging."), 0);
  EXPECT_EQ(corelm::temp_writer_pid("other.tmp.5.1", "part.tmp."), 0);
  EXPECT_TRUE(corelm::process_alive(::getpid()));
  EXPECT_FALSE(corelm::process_alive(0));
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  EXPECT_FALSE(corelm::process_alive(pid)) << "a reaped child is gone";
}
