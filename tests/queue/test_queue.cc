// The persistent queue: its state machine, leases, dedup, bounds and file checks, and that it
// stays exactly-once with two processes on one file and under kill -9 of a worker.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "corelm/queue.h"
#include "queue/kill_worker.h"
#include "queue/queue_dir_fixture.h"

namespace fs = std::filesystem;
using namespace corelm::queue;

namespace {

using QueueTest = QueueDirTest;

std::string body_of(int i) { return "{\"prompt\":\"p" + std::to_string(i) + "\",\"max_tokens\":4}"; }

// Runs `sql` on the file with plain SQLite (no corelm), returning the first column of the
// first row as text (empty when none).
std::string sql_scalar(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  std::string out;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  } else {
    out = std::string("error: ") + sqlite3_errmsg(db);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

void sql_exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

template <typename E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected exception not thrown";
  return {};
}

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int wait_child(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

}  // namespace

TEST_F(QueueTest, StateMachineQueuedRunningDoneAndOldestFirst) {
  Queue q = Queue::open(path_);
  EXPECT_EQ(q.schema_version(), Queue::kSchemaVersion);
  RequestId a = q.enqueue("m", body_of(1), std::string("b1"), std::string("c1"));
  RequestId b = q.enqueue("m", body_of(2), std::string("b1"), std::string("c2"));
  RequestId c = q.enqueue("m", body_of(3));
  EXPECT_EQ(q.counts().queued, 3);
  EXPECT_EQ(q.get(a)->state, RequestState::queued);

  auto leased = q.lease("w1", 2);
  ASSERT_EQ(leased.size(), 2u);
  EXPECT_EQ(leased[0].id, a);
  EXPECT_EQ(leased[1].id, b);
  EXPECT_EQ(leased[0].attempts, 1);
  EXPECT_EQ(leased[0].body, body_of(1));
  EXPECT_EQ(leased[0].custom_id.value_or(""), "c1");
  EXPECT_EQ(q.get(a)->state, RequestState::running);
  EXPECT_EQ(q.get(a)->worker_id, "w1");
  EXPECT_FALSE(q.get(a)->result.has_value());

  q.complete(a, "w1", Result{200, "{\"text\":\"hi\"}", ""});
  auto ia = q.get(a);
  EXPECT_EQ(ia->state, RequestState::done);
  ASSERT_TRUE(ia->result.has_value());
  EXPECT_EQ(ia->result->body, "{\"text\":\"hi\"}");
  EXPECT_EQ(ia->result->status_code, 200);
  // A second complete of a done request is refused: no duplicate result.
  EXPECT_THROW(q.complete(a, "w1", Result{200, "{}", ""}), LeaseLostError);

  EXPECT_EQ(q.fail(b, "w1", "transient"), RequestState::queued);
  EXPECT_EQ(q.get(b)->attempts, 1);
  auto again = q.lease("w2", 5);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].id, b);  // re-queued b is older than c
  EXPECT_EQ(again[0].attempts, 2);
  EXPECT_EQ(again[1].id, c);
  EXPECT_TRUE(q.lease("w2", 5).empty());

  Counts bc = q.counts("b1");
  EXPECT_EQ(bc.done, 1);
  EXPECT_EQ(bc.running, 1);
  EXPECT_EQ(bc.total(), 2);
  Counts all = q.counts();
  EXPECT_EQ(all.running, 2);
  EXPECT_EQ(all.done, 1);
  EXPECT_FALSE(q.get(9999).has_value());
}

TEST_F(QueueTest, BadInputIsRefusedByName) {
  Queue q = Queue::open(path_);
  EXPECT_THROW(q.enqueue("", "{}"), corelm::ValueError);
  EXPECT_NE(message_of<corelm::ValueError>([&] { q.enqueue("m", "{not json", std::string("b"), std::string("x")); })
                .find("not valid JSON (custom_id x)"),
            std::string::npos);
  q.enqueue("m", "{}", std::string("b"), std::string("dup"));
  std::string msg = message_of<corelm::ValueError>([&] { q.enqueue("m", "{}", std::string("b"), std::string("dup")); });
  EXPECT_NE(msg.find("duplicate custom_id 'dup' in batch b"), std::string::npos) << msg;
  q.enqueue("m", "{}", std::string("other"), std::string("dup"));  // unique per batch only
  EXPECT_THROW(q.lease("w", 0), corelm::ValueError);
  EXPECT_THROW(q.lease("", 1), corelm::ValueError);
  EXPECT_THROW(q.complete(12345, "w", Result{}), corelm::IndexError);
  EXPECT_THROW(Queue::open(path_, QueueOptions{.max_requests = 0}), corelm::ValueError);
  EXPECT_THROW(Queue::open(path_, QueueOptions{.lease_seconds = 0}), corelm::ValueError);
  EXPECT_THROW(Queue::open(path_, QueueOptions{.max_attempts = 0}), corelm::ValueError);
  EXPECT_EQ(q.counts().total(), 2);
}

TEST_F(QueueTest, DedupReturnsStoredResultOfIdenticalDoneRequest) {
  Queue q = Queue::open(path_);
  RequestId a = q.enqueue("m", body_of(1));
  // Not done yet: an identical request is queued on its own.
  RequestId a2 = q.enqueue("m", body_of(1));
  EXPECT_EQ(q.get(a2)->state, RequestState::queued);
  auto l = q.lease("w", 1);
  ASSERT_EQ(l[0].id, a);
  q.complete(a, "w", Result{200, "{\"out\":1}", ""});
  RequestId d = q.enqueue("m", body_of(1), std::string("b"), std::string("x"));
  auto info = q.get(d);
  EXPECT_EQ(info->state, RequestState::done);
  ASSERT_TRUE(info->result.has_value());
  EXPECT_EQ(info->result->body, "{\"out\":1}");
  EXPECT_EQ(info->custom_id.value_or(""), "x");
  EXPECT_EQ(q.get(q.enqueue("m2", body_of(1)))->state, RequestState::queued);  // model differs
  EXPECT_EQ(q.get(q.enqueue("m", body_of(2)))->state, RequestState::queued);   // body differs
  Queue nodedup = Queue::open(path_, QueueOptions{.dedup = false});
  EXPECT_EQ(nodedup.get(nodedup.enqueue("m", body_of(1)))->state, RequestState::queued);
}

TEST_F(QueueTest, ExpiredLeaseIsReclaimedAndStaleCompleteRefused) {
  Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 0.5});
  RequestId a = q.enqueue("m", body_of(1));
  ASSERT_EQ(q.lease("slow", 1).size(), 1u);
  EXPECT_EQ(q.reclaim(), 0);  // still held
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(q.reclaim(), 1);
  EXPECT_EQ(q.get(a)->state, RequestState::queued);
  auto l = q.lease("fast", 1);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].attempts, 2);
  std::string msg = message_of<LeaseLostError>([&] { q.complete(a, "slow", Result{200, "{\"stale\":1}", ""}); });
  EXPECT_NE(msg.find("by worker slow refused"), std::string::npos) << msg;
  EXPECT_NE(msg.find("under worker fast"), std::string::npos) << msg;
  EXPECT_THROW(q.fail(a, "slow", "x"), LeaseLostError);
  q.complete(a, "fast", Result{200, "{\"fresh\":1}", ""});
  EXPECT_EQ(q.get(a)->result->body, "{\"fresh\":1}");
}

TEST_F(QueueTest, CompleteManyStoresHeldAndReturnsRefused) {
  Queue q = Queue::open(path_);
  for (int i = 0; i < 4; ++i) q.enqueue("m", body_of(i));
  auto mine = q.lease("a", 3);
  auto theirs = q.lease("b", 1);
  ASSERT_EQ(mine.size(), 3u);
  ASSERT_EQ(theirs.size(), 1u);
  std::vector<std::pair<RequestId, Result>> rs;
  for (const auto& r : mine) rs.push_back({r.id, Result{200, "{\"n\":" + std::to_string(r.id) + "}", ""}});
  rs.push_back({theirs[0].id, Result{200, "{}", ""}});
  auto refused = q.complete_many("a", rs);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0], theirs[0].id);
  EXPECT_EQ(q.counts().done, 3);
  EXPECT_EQ(q.get(theirs[0].id)->state, RequestState::running);
  EXPECT_EQ(q.get(mine[1].id)->result->body, "{\"n\":" + std::to_string(mine[1].id) + "}");
}

TEST_F(QueueTest, RenewKeepsTheLeaseAndLeaseReclaimsExpiredOnes) {
  Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 1.0});
  q.enqueue("m", body_of(1));
  q.enqueue("m", body_of(2));
  ASSERT_EQ(q.lease("keeper", 1).size(), 1u);
  ASSERT_EQ(q.lease("sleeper", 1).size(), 1u);
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    EXPECT_EQ(q.renew("keeper"), 1);
  }
  // sleeper's lease (over 1.25 s old) expired; lease() reclaims it before choosing.
  auto l = q.lease("other", 5);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].body, body_of(2));
  EXPECT_EQ(q.renew("sleeper"), 0);
  EXPECT_EQ(q.counts().running, 2);
}

TEST_F(QueueTest, LeasesOfADeadProcessAreReclaimedAtOnce) {
  { Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 3600});
    for (int i = 0; i < 3; ++i) q.enqueue("m", body_of(i)); }
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 3600});
      _exit(q.lease("child", 2).size() == 2 ? 0 : 1);
    } catch (...) {
      _exit(2);
    }
  }
  int status = wait_child(pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 3600});
  EXPECT_EQ(q.counts().running, 2);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(q.reclaim(), 2);  // not after the hour-long lease: the pid is gone
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  Counts c = q.counts();
  EXPECT_EQ(c.queued, 3);
  EXPECT_EQ(c.running, 0);
  EXPECT_EQ(sql_scalar(path_, "SELECT last_error FROM requests WHERE id = 1").find("is gone") != std::string::npos, true);
}

TEST_F(QueueTest, MaxAttemptsEndsInAnErrorResult) {
  Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 0.1, .max_attempts = 2});
  RequestId a = q.enqueue("m", body_of(1));
  RequestId b = q.enqueue("m", body_of(2));
  ASSERT_EQ(q.lease("w", 1)[0].id, a);
  EXPECT_EQ(q.fail(a, "w", "oom"), RequestState::queued);
  ASSERT_EQ(q.lease("w", 1)[0].id, a);
  EXPECT_EQ(q.fail(a, "w", "oom again"), RequestState::failed);
  auto ia = q.get(a);
  EXPECT_EQ(ia->state, RequestState::failed);
  ASSERT_TRUE(ia->result.has_value());
  EXPECT_NE(ia->result->error.find("failed after 2 attempts; last: oom again"), std::string::npos) << ia->result->error;
  // A poison request whose worker hangs every time also stops after max_attempts.
  for (int i = 0; i < 2; ++i) {
    auto l = q.lease("hung", 1);
    ASSERT_EQ(l.size(), 1u);
    EXPECT_EQ(l[0].id, b);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_EQ(q.reclaim(), 1);
  }
  EXPECT_EQ(q.get(b)->state, RequestState::failed);
  EXPECT_NE(q.get(b)->result->error.find("expired"), std::string::npos);
  EXPECT_TRUE(q.lease("w", 5).empty());
  EXPECT_EQ(q.counts().failed, 2);
}

TEST_F(QueueTest, FullQueueIsRefusedAllOrNothing) {
  Queue q = Queue::open(path_, QueueOptions{.max_requests = 3});
  for (int i = 0; i < 3; ++i) q.enqueue("m", body_of(i));
  std::string msg = message_of<QueueFullError>([&] { q.enqueue("m", body_of(9)); });
  EXPECT_NE(msg.find("is full: 3 requests queued or running, max_requests 3"), std::string::npos) << msg;
  auto l = q.lease("w", 1);
  q.complete(l[0].id, "w", Result{200, "{}", ""});  // done rows do not count
  EXPECT_THROW(q.enqueue_many({{"m", body_of(10)}, {"m", body_of(11)}}), QueueFullError);
  EXPECT_EQ(q.counts().total(), 3);  // nothing of the refused pair was stored
  q.enqueue_many({{"m", body_of(10)}});
  EXPECT_EQ(q.counts().queued, 3);
}

TEST_F(QueueTest, StorageFullIsAClearErrorAndLosesNothingStored) {
  Queue q = Queue::open(path_, QueueOptions{.max_db_bytes = 256 * 1024});
  std::string big = "{\"prompt\":\"" + std::string(2000, 'x') + "\",\"i\":";
  int stored = 0;
  std::string msg;
  for (int i = 0; i < 1000; ++i) {
    try {
      q.enqueue("m", big + std::to_string(i) + "}");
      ++stored;
    } catch (const StorageFullError& e) {
      msg = e.what();
      break;
    }
  }
  ASSERT_FALSE(msg.empty()) << "never full";
  EXPECT_GT(stored, 10);
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_db_bytes=262144"), std::string::npos) << msg;
  EXPECT_EQ(q.counts().queued, stored);  // the refused transaction left nothing behind
  // Results are refused the same way, each transaction whole: a refused complete leaves the
  // request running with no result, for its worker to retry.
  std::optional<RequestId> refused;
  int completed = 0;
  for (int i = 0; i < stored && !refused; ++i) {
    std::vector<LeasedRequest> l;
    try {
      l = q.lease("w", 1);
    } catch (const StorageFullError&) {
      break;
    }
    ASSERT_EQ(l.size(), 1u);
    try {
      q.complete(l[0].id, "w", Result{200, std::string(4000, 'r'), ""});
      ++completed;
    } catch (const StorageFullError&) {
      refused = l[0].id;
      EXPECT_EQ(q.get(l[0].id)->state, RequestState::running);
      EXPECT_FALSE(q.get(l[0].id)->result.has_value());
    }
  }
  ASSERT_TRUE(refused.has_value()) << "4 KB results never filled the queue";
  EXPECT_EQ(sql_scalar(path_, "PRAGMA integrity_check"), "ok");
  // With room again (a larger cap, as after freeing disk) the same worker finishes it.
  Queue roomy = Queue::open(path_, QueueOptions{.max_db_bytes = 4 << 20});
  roomy.complete(*refused, "w", Result{200, std::string(4000, 'r'), ""});
  EXPECT_EQ(roomy.counts().done, completed + 1);
  EXPECT_EQ(roomy.counts().queued, stored - completed - 1);
}

TEST_F(QueueTest, AWriteLockHeldTooLongIsAClearError) {
  Queue q = Queue::open(path_, QueueOptions{.busy_timeout_ms = 100});
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  std::string msg = message_of<corelm::IOError>([&] { q.enqueue("m", "{}"); });
  EXPECT_NE(msg.find("busy_timeout_ms=100"), std::string::npos) << msg;
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(other);
  q.enqueue("m", "{}");
  EXPECT_EQ(q.counts().queued, 1);
}

// A new state file that another connection is about to write (a second server opening the same
// new state dir holds its write lock): the switch to WAL needs the file to itself, and SQLite
// answers SQLITE_BUSY at once, without the busy handler (this connection holds a read lock, the
// other a reserved one). The open retries for busy_timeout_ms, then fails naming the statement
// and the timeout, in bounded time; once the other is gone the same open succeeds.
TEST_F(QueueTest, TheSwitchToWalRetriesWhileAnotherHoldsTheFileThenFailsClearly) {
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = message_of<corelm::IOError>([&] { Queue::open(path_, QueueOptions{.busy_timeout_ms = 200}); });
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("PRAGMA journal_mode = WAL"), std::string::npos) << msg;
  EXPECT_NE(msg.find("busy_timeout_ms=200"), std::string::npos) << msg;
  EXPECT_GE(waited, 0.19) << "gave up before busy_timeout_ms";
  EXPECT_LT(waited, 10.0) << "the retry did not stop at busy_timeout_ms";
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(other);
  Queue q = Queue::open(path_, QueueOptions{.busy_timeout_ms = 200});
  EXPECT_EQ(sql_scalar(path_, "PRAGMA journal_mode"), "wal");
  q.enqueue("m", "{}");
  EXPECT_EQ(q.counts().queued, 1);
}

TEST_F(QueueTest, CancelBatchCancelsQueuedOnly) {
  Queue q = Queue::open(path_);
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(q.enqueue("m", body_of(i), std::string("b"), "c" + std::to_string(i)));
  q.enqueue("m", body_of(7), std::string("keep"));
  auto l = q.lease("w", 1);
  EXPECT_EQ(q.cancel_batch("b"), 2);
  Counts c = q.counts("b");
  EXPECT_EQ(c.cancelled, 2);
  EXPECT_EQ(c.running, 1);
  q.complete(l[0].id, "w", Result{200, "{}", ""});
  EXPECT_EQ(q.counts("b").done, 1);
  EXPECT_EQ(q.counts("keep").queued, 1);
  EXPECT_EQ(q.counts().cancelled, 2);
}

TEST_F(QueueTest, SchemaIsCreatedOnEmptyFilesAndSurvivesReopen) {
  { std::ofstream(path_).flush(); }  // a 0-byte file
  { Queue q = Queue::open(path_);
    EXPECT_EQ(q.schema_version(), Queue::kSchemaVersion);
    q.enqueue("m", body_of(1)); }
  std::string other = dir_ + "/empty_sqlite.db";
  sql_exec(other, "PRAGMA user_version = 0");  // a SQLite file with no tables, version 0
  EXPECT_EQ(Queue::open(other).schema_version(), Queue::kSchemaVersion);
  Queue q = Queue::open(path_);
  EXPECT_EQ(q.counts().queued, 1);
  EXPECT_EQ(sql_scalar(path_, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(sql_scalar(path_, "PRAGMA user_version"), std::to_string(Queue::kSchemaVersion));
}

// A file written by the v1 code (its DDL, application id and rows as v1 stored them, content
// hashes included) is migrated in place: its rows keep their state, lease and results, dedup
// still finds the v1 results, and new rows can carry an endpoint.
TEST_F(QueueTest, V1FileIsMigratedInPlaceAndItsRowsKeepWorking) {
  sql_exec(path_, std::string(schema_v1_sql()) + "PRAGMA application_id = " + std::to_string(0x434C4D51) +
                      "; PRAGMA user_version = 1;");
  // The v1 hash of ("m", body_of(1)) (FNV-1a of model \0 body), computed here independently.
  auto fnv = fnv1a_model_body;
  sql_exec(path_,
           "INSERT INTO requests(id, batch_id, custom_id, model, body, content_hash, state, attempts, created_at, updated_at) "
           "VALUES(1, 'b', 'c1', 'm', '" + body_of(1) + "', '" + fnv("m", body_of(1)) + "', 'done', 1, 1, 1),"
           "(2, 'b', 'c2', 'm', '" + body_of(2) + "', '" + fnv("m", body_of(2)) + "', 'queued', 0, 1, 1);"
           "INSERT INTO results VALUES(1, 200, '{\"text\":\"v1\"}', NULL, 1);");
  EXPECT_EQ(sql_scalar(path_, "SELECT n FROM state_counts WHERE state = 'queued'"), "1");
  Queue q = Queue::open(path_);
  EXPECT_EQ(q.schema_version(), Queue::kSchemaVersion);
  EXPECT_EQ(sql_scalar(path_, "PRAGMA user_version"), std::to_string(Queue::kSchemaVersion));
  auto done = q.get(1);
  ASSERT_TRUE(done && done->result);
  EXPECT_EQ(done->state, RequestState::done);
  EXPECT_EQ(done->result->body, "{\"text\":\"v1\"}");
  EXPECT_EQ(done->endpoint, "/v1/completions");
  EXPECT_EQ(q.counts("b").queued, 1);
  auto l = q.lease("w", 4);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].id, 2);
  EXPECT_EQ(l[0].endpoint, "/v1/completions");
  EXPECT_EQ(l[0].custom_id, "c2");
  q.complete(2, "w", Result{200, "{}", ""});
  // Dedup against a v1 row: its stored hash matches what v2 computes for the default endpoint.
  RequestId again = q.enqueue("m", body_of(1));
  EXPECT_EQ(q.get(again)->state, RequestState::done);
  EXPECT_EQ(q.get(again)->result->body, "{\"text\":\"v1\"}");
  // A chat row next to the migrated ones.
  RequestId chat = q.enqueue("m", body_of(1), std::nullopt, std::nullopt, "/v1/chat/completions");
  EXPECT_EQ(q.get(chat)->state, RequestState::queued);
  EXPECT_EQ(q.get(chat)->endpoint, "/v1/chat/completions");
  EXPECT_EQ(q.counts().done, 3);
  // Reopening a migrated file migrates nothing.
  Queue q2 = Queue::open(path_);
  EXPECT_EQ(q2.counts().total(), 4);
}

// The endpoint travels with the row, is part of the dedup key, and must be one of the two
// completions endpoints.
TEST_F(QueueTest, EndpointIsStoredLeasedAndPartOfTheDedupKey) {
  Queue q = Queue::open(path_);
  RequestId a = q.enqueue("m", body_of(1), std::nullopt, std::nullopt, "/v1/chat/completions");
  auto l = q.lease("w", 1);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].endpoint, "/v1/chat/completions");
  q.complete(a, "w", Result{200, "{\"chat\":1}", ""});
  RequestId same = q.enqueue("m", body_of(1), std::nullopt, std::nullopt, "/v1/chat/completions");
  EXPECT_EQ(q.get(same)->state, RequestState::done);
  EXPECT_EQ(q.get(same)->result->body, "{\"chat\":1}");
  RequestId other = q.enqueue("m", body_of(1));  // same body, the completions endpoint
  EXPECT_EQ(q.get(other)->state, RequestState::queued);
  auto ids = q.enqueue_many({NewRequest{"m", body_of(5), std::nullopt, std::nullopt, "/v1/chat/completions"}});
  EXPECT_EQ(q.get(ids[0])->endpoint, "/v1/chat/completions");
  std::string msg = message_of<corelm::ValueError>(
      [&] { q.enqueue("m", body_of(2), std::nullopt, std::nullopt, "/v1/embeddings"); });
  EXPECT_NE(msg.find("/v1/embeddings"), std::string::npos) << msg;
}

TEST_F(QueueTest, ForeignCorruptAndFutureFilesAreRefusedByName) {
  EXPECT_NE(message_of<corelm::IOError>([&] { Queue::open(dir_ + "/no/such/queue.sqlite"); }).find("does not exist"),
            std::string::npos);

  std::string text = dir_ + "/text.sqlite";
  { std::ofstream(text) << "hello, this is not a database\n"; }
  std::string msg = message_of<corelm::FormatError>([&] { Queue::open(text); });
  EXPECT_NE(msg.find(text), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a SQLite database"), std::string::npos) << msg;

  std::string foreign = dir_ + "/foreign.sqlite";
  sql_exec(foreign, "CREATE TABLE photos(id INTEGER PRIMARY KEY, name TEXT); INSERT INTO photos(name) VALUES('x')");
  std::string before = read_all(foreign);
  msg = message_of<corelm::FormatError>([&] { Queue::open(foreign); });
  EXPECT_NE(msg.find(foreign), std::string::npos) << msg;
  EXPECT_NE(msg.find("another application"), std::string::npos) << msg;
  EXPECT_EQ(read_all(foreign), before);  // not switched to WAL, not touched
  EXPECT_FALSE(fs::exists(foreign + "-wal"));

  { Queue q = Queue::open(path_); q.enqueue("m", body_of(1)); }
  sql_exec(path_, "PRAGMA user_version = 7");
  msg = message_of<corelm::FormatError>([&] { Queue::open(path_); });
  EXPECT_NE(msg.find("schema version 7 is newer than this corelm knows (" + std::to_string(Queue::kSchemaVersion) + ")"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;

  // A queue whose first page (the schema) is overwritten after the header.
  std::string bad = dir_ + "/corrupt.sqlite";
  { Queue q = Queue::open(bad); for (int i = 0; i < 50; ++i) q.enqueue("m", body_of(i)); }
  {
    sqlite3* db = nullptr;  // fold the WAL into the main file so the damage is what is read
    sqlite3_open(bad.c_str(), &db);
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode = DELETE", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    std::string junk(3000, '\xA5');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  try {
    Queue q = Queue::open(bad);
    q.counts();
    q.lease("w", 10);
    ADD_FAILURE() << "a corrupt queue opened";
  } catch (const corelm::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

// Two processes lease from one file at once: no request is handed to both, and together they
// complete all N exactly once.
TEST_F(QueueTest, TwoProcessesNeverLeaseTheSameRequest) {
  constexpr int N = 500;
  {
    Queue q = Queue::open(path_);
    std::vector<NewRequest> reqs;
    for (int i = 0; i < N; ++i) reqs.push_back({"m", body_of(i), std::string("b"), "c" + std::to_string(i)});
    q.enqueue_many(reqs);
  }
  pid_t kids[2];
  for (int k = 0; k < 2; ++k) {
    kids[k] = ::fork();
    ASSERT_GE(kids[k], 0);
    if (kids[k] == 0) {
      try {
        Queue q = Queue::open(path_);
        std::string w = "w" + std::to_string(k);
        std::ofstream log(dir_ + "/" + w + ".ids");
        for (;;) {
          auto got = q.lease(w, 4);
          if (got.empty()) break;
          for (const auto& r : got) {
            ::usleep(200);  // the generation a real worker does between lease and complete
            q.complete(r.id, w, Result{200, "{\"worker\":\"" + w + "\"}", ""});
            log << r.id << "\n";
          }
        }
        log.close();
        _exit(0);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", k, e.what());
        _exit(1);
      }
    }
  }
  for (pid_t p : kids) {
    int st = wait_child(p);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  std::map<int64_t, std::string> who;
  for (int k = 0; k < 2; ++k) {
    std::ifstream in(dir_ + "/w" + std::to_string(k) + ".ids");
    int64_t id;
    int n = 0;
    while (in >> id) {
      EXPECT_TRUE(who.emplace(id, "w" + std::to_string(k)).second) << "request " << id << " completed twice";
      ++n;
    }
    EXPECT_GT(n, 0) << "worker " << k << " got nothing (no concurrency exercised)";
  }
  EXPECT_EQ(who.size(), static_cast<size_t>(N));
  Queue q = Queue::open(path_);
  EXPECT_EQ(q.counts().done, N);
  EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(*) FROM results"), std::to_string(N));
  EXPECT_EQ(sql_scalar(path_, "SELECT MAX(attempts) FROM requests"), "1");
  for (const auto& [id, w] : who) {
    auto info = q.get(id);
    ASSERT_TRUE(info && info->result);
    EXPECT_EQ(info->result->body, "{\"worker\":\"" + w + "\"}");
  }
}

// The server's threads share one Queue object: the same exactly-once holds within a process.
TEST_F(QueueTest, ThreadsSharingOneQueueCompleteEachRequestOnce) {
  constexpr int N = 200;
  Queue q = Queue::open(path_, QueueOptions{.sync = Sync::normal});
  std::vector<NewRequest> reqs;
  for (int i = 0; i < N; ++i) reqs.push_back({"m", body_of(i)});
  q.enqueue_many(reqs);
  std::vector<std::vector<RequestId>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::string w = "t" + std::to_string(t);
      for (auto l = q.lease(w, 3); !l.empty(); l = q.lease(w, 3))
        for (const auto& r : l) {
          q.complete(r.id, w, Result{200, "{}", ""});
          got[t].push_back(r.id);
        }
    });
  for (auto& th : threads) th.join();
  std::set<RequestId> all;
  size_t n = 0;
  for (const auto& v : got) {
    all.insert(v.begin(), v.end());
    n += v.size();
  }
  EXPECT_EQ(n, static_cast<size_t>(N));
  EXPECT_EQ(all.size(), static_cast<size_t>(N));
  EXPECT_EQ(q.counts().done, N);
}

// A worker completing in a loop is killed with SIGKILL at a random moment: every result it
// reported is on disk once, the file is consistent, and nothing is lost.
TEST_F(QueueTest, KillNineMidLoopLosesAndDuplicatesNothing) {
  constexpr int N = 400;
  {
    Queue q = Queue::open(path_);
    std::vector<NewRequest> reqs;
    for (int i = 0; i < N; ++i) reqs.push_back({"m", body_of(i)});
    q.enqueue_many(reqs);
  }
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 3; ++round) {
    const std::string reported = run_and_kill_worker(rng, [&](int report) {
      Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 3600});
      for (auto got = q.lease("victim", 3); !got.empty(); got = q.lease("victim", 3))
        for (const auto& r : got) {
          q.complete(r.id, "victim", Result{200, killed_worker_body(r.id), ""});
          report_done(report, r.id);  // reported only once complete() returned
        }
    });
    EXPECT_EQ(sql_scalar(path_, "PRAGMA integrity_check"), "ok");
    Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 3600});
    expect_reported_done(q, reported);
    q.reclaim();  // the victim's in-flight leases come back at once
    Counts c = q.counts();
    EXPECT_EQ(c.running, 0);
    EXPECT_EQ(c.total(), N);
    EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(*) FROM results"), std::to_string(c.done));
    EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(*) FROM results s JOIN requests r ON r.id = s.request_id "
                                "WHERE r.state <> 'done'"), "0");
  }
  // The parent drains what is left: all N done, one result each.
  Queue q = Queue::open(path_);
  for (auto got = q.lease("parent", 64); !got.empty(); got = q.lease("parent", 64)) {
    std::vector<std::pair<RequestId, Result>> rs;
    for (const auto& r : got) rs.push_back({r.id, Result{200, "{\"id\":" + std::to_string(r.id) + "}", ""}});
    EXPECT_TRUE(q.complete_many("parent", rs).empty());
  }
  EXPECT_EQ(q.counts().done, N);
  EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(DISTINCT request_id) FROM results"), std::to_string(N));
  EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(*) FROM results s JOIN requests r ON r.id = s.request_id "
                              "WHERE s.body <> '{\"id\":' || r.id || '}'"), "0");
}

// Micro-benchmark (not a test): µs per enqueue and per lease+complete cycle over 10,000 requests,
// one transaction each, for both sync modes. Run with --gtest_also_run_disabled_tests.
TEST_F(QueueTest, DISABLED_Bench) {
  constexpr int N = 10000;
  for (Sync s : {Sync::full, Sync::normal}) {
    std::string p = dir_ + (s == Sync::full ? "/full.sqlite" : "/normal.sqlite");
    Queue q = Queue::open(p, QueueOptions{.sync = s, .dedup = true});
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < N; ++i) q.enqueue("m", body_of(i));
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < N; ++i) {
      auto got = q.lease("w", 1);
      q.complete(got[0].id, "w", Result{200, "{\"text\":\"0123456789\"}", ""});
    }
    auto t2 = std::chrono::steady_clock::now();
    std::vector<NewRequest> many;
    for (int i = 0; i < N; ++i) many.push_back({"m", body_of(N + i)});
    auto t3 = std::chrono::steady_clock::now();
    q.enqueue_many(many);
    auto t4 = std::chrono::steady_clock::now();
    auto t5 = std::chrono::steady_clock::now();
    for (int done = 0; done < N;) {
      auto got = q.lease("w", 8);
      std::vector<std::pair<RequestId, Result>> rs;
      for (const auto& r : got) rs.push_back({r.id, Result{200, "{\"text\":\"0123456789\"}", ""}});
      q.complete_many("w", rs);
      done += static_cast<int>(got.size());
    }
    auto t6 = std::chrono::steady_clock::now();
    auto us = [](auto d) { return std::chrono::duration<double, std::micro>(d).count() / N; };
    std::printf("{\"bench\":\"queue\",\"sync\":\"%s\",\"n\":%d,\"enqueue_us\":%.1f,\"lease_complete_us\":%.1f,"
                "\"enqueue_many_us\":%.2f,\"lease8_complete_many_us\":%.1f,\"db_bytes\":%lld}\n",
                s == Sync::full ? "full" : "normal", N, us(t1 - t0), us(t2 - t1), us(t4 - t3), us(t6 - t5),
                static_cast<long long>(fs::file_size(p) + (fs::exists(p + "-wal") ? fs::file_size(p + "-wal") : 0)));
  }
}

// Micro-benchmark (not a test; issue 16): the CPU (user + sys) per row of the journal of
// `corelm run batch`, without a model: enqueue_many of 5,000 rows, lease 16 + complete_many 16
// with a 640-byte result until drained (Sync::full), then the results read back with get() per
// row and with for_each_result pages; then the same rows acked and refilled with
// complete_and_lease (one transaction per group). Run with --gtest_also_run_disabled_tests.
TEST_F(QueueTest, DISABLED_BenchJournalPerRow) {
  constexpr int N = 5000;
  auto cpu = [] {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
  };
  Queue q = Queue::open(path_, QueueOptions{.sync = Sync::full, .dedup = false});
  std::vector<NewRequest> rows;
  for (int i = 0; i < N; ++i)
    rows.push_back({"model", "{\"prompt\":\"n=" + std::to_string(i) + ":\",\"max_tokens\":8,\"temperature\":0}",
                    std::string("run-batch"), "r" + std::to_string(i)});
  const std::string result = "{\"t\":\"" + std::string(632, 'x') + "\"}";
  const double c0 = cpu();
  q.enqueue_many(rows);
  const double c1 = cpu();
  for (int done = 0; done < N;) {
    auto l = q.lease("w", 16);
    std::vector<std::pair<RequestId, Result>> rs;
    for (const auto& r : l) rs.push_back({r.id, Result{200, result, ""}});
    ASSERT_TRUE(q.complete_many("w", rs).empty());
    done += static_cast<int>(l.size());
  }
  const double c2 = cpu();
  size_t bytes = 0;
  for (RequestId id = 1; id <= N; ++id) bytes += q.get(id)->result->body.size();
  const double c3 = cpu();
  q.for_each_result("run-batch", [&](const BatchRow& b) {
    bytes += b.result->body.size();
    return true;
  });
  const double c4 = cpu();
  EXPECT_EQ(bytes, 2 * N * result.size());
  // The pattern `corelm run batch` uses since schema v3: each ack group and the refill that
  // follows it in one transaction (complete_and_lease), on a fresh file with the same rows.
  Queue q2 = Queue::open(dir_ + "/combined.sqlite", QueueOptions{.sync = Sync::full, .dedup = false});
  q2.enqueue_many(rows);
  const double c5 = cpu();
  auto held = q2.lease("w", 16);
  for (int done = 0; done < N;) {
    std::vector<std::pair<RequestId, Result>> rs;
    for (const auto& r : held) rs.push_back({r.id, Result{200, result, ""}});
    done += static_cast<int>(held.size());
    AckAndLease got = q2.complete_and_lease("w", rs, 16);
    ASSERT_TRUE(got.refused.empty());
    held = std::move(got.leased);
  }
  const double c6 = cpu();
  EXPECT_EQ(q2.counts().done, N);
  // The same with groups of 64 (what `corelm run batch` acks per commit since schema v4).
  Queue q3 = Queue::open(dir_ + "/combined64.sqlite", QueueOptions{.sync = Sync::full, .dedup = false});
  q3.enqueue_many(rows);
  const double c7 = cpu();
  held = q3.lease("w", 64);
  for (int done = 0; done < N;) {
    std::vector<std::pair<RequestId, Result>> rs;
    for (const auto& r : held) rs.push_back({r.id, Result{200, result, ""}});
    done += static_cast<int>(held.size());
    AckAndLease got = q3.complete_and_lease("w", rs, 64);
    ASSERT_TRUE(got.refused.empty());
    held = std::move(got.leased);
  }
  const double c8 = cpu();
  EXPECT_EQ(q3.counts().done, N);
  std::printf("{\"bench\":\"journal_per_row\",\"n\":%d,\"enqueue_us\":%.1f,\"lease16_complete_us\":%.1f,"
              "\"get_per_row_us\":%.1f,\"for_each_result_us\":%.1f,\"complete_and_lease16_us\":%.1f,"
              "\"complete_and_lease64_us\":%.1f}\n",
              N, (c1 - c0) / N * 1e6, (c2 - c1) / N * 1e6, (c3 - c2) / N * 1e6, (c4 - c3) / N * 1e6,
              (c6 - c5) / N * 1e6, (c8 - c7) / N * 1e6);
}
