// Schema v3 of the persistent queue (issue 16, the queue's fixed cost per request): the v2 -> v3
// migration keeps every row's state, lease and result; the state counts, now kept by the
// statements instead of per-row triggers, match the rows after every kind of change; and
// complete_and_lease (an ack group and its refill in one transaction) stays exactly-once under
// kill -9.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "corelm/queue.h"
#include "queue/kill_worker.h"
#include "queue/queue_dir_fixture.h"

using namespace corelm::queue;

namespace {

using QueueSchemaTest = QueueDirTest;

std::string body_of(int i) { return "{\"prompt\":\"p" + std::to_string(i) + "\",\"max_tokens\":4}"; }

// All rows of the first `cols` columns of `sql`, each row's columns joined by '|', run with plain
// SQLite (no corelm). NULL reads as "∅".
std::vector<std::string> sql_rows(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  std::vector<std::string> out;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << sqlite3_errmsg(db) << " in " << sql;
  } else {
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::string row;
      for (int c = 0; c < sqlite3_column_count(st); ++c) {
        if (c) row += '|';
        const unsigned char* t = sqlite3_column_text(st, c);
        row += t ? reinterpret_cast<const char*>(t) : "∅";
      }
      out.push_back(row);
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

std::string sql_scalar(const std::string& path, const std::string& sql) {
  auto rows = sql_rows(path, sql);
  return rows.empty() ? std::string() : rows.front();
}

void sql_exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

std::string host() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// The counts the queue reports against the rows themselves (what the v2 triggers guaranteed).
void expect_counts_match_rows(Queue& q, const std::string& path, const std::string& where) {
  std::map<std::string, int64_t> rows;
  for (const std::string& r : sql_rows(path, "SELECT state, COUNT(*) FROM requests GROUP BY state")) {
    auto bar = r.find('|');
    rows[r.substr(0, bar)] = std::stoll(r.substr(bar + 1));
  }
  Counts c = q.counts();
  EXPECT_EQ(c.queued, rows["queued"]) << where;
  EXPECT_EQ(c.running, rows["running"]) << where;
  EXPECT_EQ(c.done, rows["done"]) << where;
  EXPECT_EQ(c.failed, rows["failed"]) << where;
  EXPECT_EQ(c.cancelled, rows["cancelled"]) << where;
}

// Every column of every request with its result, in id order: what a migration must keep.
const char* kAllRows =
    "SELECT r.id, r.batch_id, r.custom_id, r.model, r.body, r.content_hash, r.state, r.attempts, r.lease_expiry, "
    "r.worker_id, r.worker_pid, r.worker_host, r.last_error, r.endpoint, s.status_code, s.body, s.error "
    "FROM requests r LEFT JOIN results s ON s.request_id = r.id ORDER BY r.id";

}  // namespace

// A file as the v2 code left it (v1 DDL + the v1 -> v2 migration, rows written through v2's
// triggers) with rows in every state, a live lease among them, opens as v3 and then v4: every
// column of every row and result is unchanged, the counts are the rows', the indexes and triggers are the current ones, and
// the rows keep working (the live lease is completed by its holder, queued rows are leased,
// cancel and pending_in_batch see the batch).
TEST_F(QueueSchemaTest, V2FileWithRowsInEveryStateMigratesToV3AndKeepsThem) {
  sql_exec(path_, std::string(schema_v1_sql()) + schema_migration_sql(2) + "PRAGMA application_id = " +
                      std::to_string(0x434C4D51) + "; PRAGMA user_version = 2;");
  const std::string pid = std::to_string(getpid()), far = "9999999999";
  sql_exec(path_,
           "INSERT INTO requests(id, batch_id, custom_id, model, body, content_hash, state, attempts, lease_expiry, "
           "worker_id, worker_pid, worker_host, last_error, created_at, updated_at, endpoint) VALUES "
           "(1, 'b', 'c1', 'm', '" + body_of(1) + "', 'h1', 'done', 1, NULL, 'w-old', " + pid + ", '" + host() +
           "', NULL, 1, 2, '/v1/completions'),"
           "(2, 'b', 'c2', 'm', '" + body_of(2) + "', 'h2', 'running', 1, " + far + ", 'w-old', " + pid + ", '" +
           host() + "', NULL, 1, 2, '/v1/chat/completions'),"
           "(3, 'b', 'c3', 'm', '" + body_of(3) + "', 'h3', 'queued', 0, NULL, NULL, NULL, NULL, NULL, 1, 1, "
           "'/v1/completions'),"
           "(4, NULL, NULL, 'm', '" + body_of(4) + "', 'h4', 'failed', 3, NULL, NULL, NULL, NULL, 'oom', 1, 2, "
           "'/v1/completions'),"
           "(5, 'b', 'c5', 'm', '" + body_of(5) + "', 'h5', 'queued', 1, NULL, NULL, NULL, NULL, 'retry', 1, 2, "
           "'/v1/completions'),"
           "(6, 'b2', 'x', 'm', '" + body_of(6) + "', 'h6', 'cancelled', 0, NULL, NULL, NULL, NULL, NULL, 1, 2, "
           "'/v1/completions'),"
           "(7, NULL, NULL, 'm2', '" + body_of(7) + "', 'h7', 'queued', 0, NULL, NULL, NULL, NULL, NULL, 1, 1, "
           "'/v1/completions');"
           "INSERT INTO results VALUES(1, 200, '{\"text\":\"one\"}', NULL, 2), (4, 500, '', 'failed after 3', 2);");
  // v2's triggers counted these rows as they went in.
  EXPECT_EQ(sql_scalar(path_, "SELECT group_concat(state || '=' || n, ',') FROM state_counts"),
            "queued=3,running=1,done=1,failed=1,cancelled=1");
  const std::vector<std::string> before = sql_rows(path_, kAllRows);
  ASSERT_EQ(before.size(), 7u);

  Queue q = Queue::open(path_);
  EXPECT_EQ(q.schema_version(), Queue::kSchemaVersion);
  EXPECT_EQ(sql_scalar(path_, "PRAGMA user_version"), std::to_string(Queue::kSchemaVersion));
  EXPECT_EQ(sql_rows(path_, kAllRows), before);  // every column of every row and result
  expect_counts_match_rows(q, path_, "after the migration");
  EXPECT_EQ(sql_scalar(path_, "PRAGMA integrity_check"), "ok");
  // The current indexes and triggers, and nothing of v2's that follows the state.
  EXPECT_EQ(sql_scalar(path_, "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_schema "
                              "WHERE tbl_name = 'requests' AND type IN ('index','trigger') AND sql IS NOT NULL "
                              "ORDER BY name)"),
            "requests_batch_order,requests_batch_pending,requests_count_delete,requests_custom_id,"
            "requests_done_hash,requests_queued,requests_running");

  auto one = q.get(1);
  ASSERT_TRUE(one && one->result);
  EXPECT_EQ(one->result->body, "{\"text\":\"one\"}");
  EXPECT_EQ(q.get(4)->result->error, "failed after 3");
  EXPECT_EQ(q.get(2)->worker_id, "w-old");
  EXPECT_EQ(q.pending_in_batch("b"), 3);  // 2 running, 3 and 5 queued
  Counts cb = q.counts("b");
  EXPECT_EQ(cb.done, 1);
  EXPECT_EQ(cb.running, 1);
  EXPECT_EQ(cb.queued, 2);

  // The live lease of the migrated row is still its holder's; the queued rows lease oldest first.
  q.complete(2, "w-old", Result{200, "{\"text\":\"two\"}", ""});
  auto l = q.lease("w", 1);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].id, 3);
  EXPECT_EQ(q.cancel_batch("b"), 1);  // row 5
  EXPECT_EQ(q.get(5)->state, RequestState::cancelled);
  EXPECT_EQ(q.pending_in_batch("b"), 1);  // row 3, running
  auto rest = q.complete_and_lease("w", {{3, Result{200, "{}", ""}}}, 4);
  EXPECT_TRUE(rest.refused.empty());
  ASSERT_EQ(rest.leased.size(), 1u);
  EXPECT_EQ(rest.leased[0].id, 7);
  EXPECT_EQ(q.pending_in_batch("b"), 0);
  expect_counts_match_rows(q, path_, "after using the migrated rows");
  EXPECT_EQ(q.get(2)->result->body, "{\"text\":\"two\"}");
}

// A file as the v3 code left it (v1 DDL + the v1 -> v2 and v2 -> v3 migrations; v3 counts its
// rows in the statements, so the state counts are written with the rows here) with rows in every
// state opens as v4 and drains: every column of every row and result is unchanged, every row is
// a dedup source (the new `dedup` column is 1), the done-hash and batch-pending indexes are v4's,
// the live lease is still its holder's, a dead worker's lease comes back at once, the queued
// rows lease oldest first, cancel and pending_in_batch see the batch, and a v3 done row still
// answers a dedup lookup.
TEST_F(QueueSchemaTest, V3FileWithRowsInEveryStateMigratesToV4AndDrains) {
  sql_exec(path_, std::string(schema_v1_sql()) + schema_migration_sql(2) + schema_migration_sql(3) +
                      "PRAGMA application_id = " + std::to_string(0x434C4D51) + "; PRAGMA user_version = 3;");
  // The hash v3 stored for a /v1/completions row (FNV-1a of model \0 body), computed independently.
  auto fnv = fnv1a_model_body;
  // A pid that is surely gone: a child that has exited and been reaped.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  const std::string pid = std::to_string(getpid()), far = "9999999999";
  auto row = [&](int id, const std::string& batch, const std::string& cid, const std::string& state, int attempts,
                 const std::string& expiry, const std::string& worker, const std::string& wpid, const std::string& err) {
    auto q = [](const std::string& v) { return v.empty() ? std::string("NULL") : "'" + v + "'"; };
    return "(" + std::to_string(id) + ", " + q(batch) + ", " + q(cid) + ", 'm', '" + body_of(id) + "', '" +
           fnv("m", body_of(id)) + "', '" + state + "', " + std::to_string(attempts) + ", " +
           (expiry.empty() ? "NULL" : expiry) + ", " + q(worker) + ", " + (wpid.empty() ? "NULL" : wpid) + ", " +
           (worker.empty() ? "NULL" : "'" + host() + "'") + ", " + q(err) + ", 1, 2, '/v1/completions')";
  };
  sql_exec(path_,
           "INSERT INTO requests(id, batch_id, custom_id, model, body, content_hash, state, attempts, lease_expiry, "
           "worker_id, worker_pid, worker_host, last_error, created_at, updated_at, endpoint) VALUES " +
               row(1, "b", "c1", "done", 1, "", "w-old", pid, "") + "," +
               row(2, "b", "c2", "running", 1, far, "w-old", pid, "") + "," +
               row(3, "b", "c3", "queued", 0, "", "", "", "") + "," +
               row(4, "", "", "failed", 3, "", "", "", "oom") + "," +
               row(5, "b", "c5", "queued", 1, "", "", "", "retry") + "," +
               row(6, "b2", "x", "cancelled", 0, "", "", "", "") + "," +
               row(7, "b", "c7", "running", 1, far, "w-dead", std::to_string(gone), "") + "," +
               row(8, "", "", "queued", 0, "", "", "", "") +
               ";"
               "INSERT INTO results VALUES(1, 200, '{\"text\":\"one\"}', NULL, 2), (4, 500, '', 'failed after 3', 2);"
               "UPDATE state_counts SET n = (SELECT COUNT(*) FROM requests r WHERE r.state = state_counts.state);");
  EXPECT_EQ(sql_scalar(path_, "SELECT group_concat(state || '=' || n, ',') FROM state_counts"),
            "queued=3,running=2,done=1,failed=1,cancelled=1");
  const std::vector<std::string> before = sql_rows(path_, kAllRows);
  ASSERT_EQ(before.size(), 8u);

  Queue q = Queue::open(path_);
  EXPECT_EQ(q.schema_version(), 4);
  EXPECT_EQ(sql_scalar(path_, "PRAGMA user_version"), "4");
  EXPECT_EQ(sql_rows(path_, kAllRows), before);  // every column of every row and result
  EXPECT_EQ(sql_scalar(path_, "SELECT group_concat(dedup, ',') FROM requests"), "1,1,1,1,1,1,1,1");
  expect_counts_match_rows(q, path_, "after the migration");
  EXPECT_EQ(sql_scalar(path_, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(sql_scalar(path_, "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_schema "
                              "WHERE tbl_name = 'requests' AND type IN ('index','trigger') AND sql IS NOT NULL "
                              "ORDER BY name)"),
            "requests_batch_order,requests_batch_pending,requests_count_delete,requests_custom_id,"
            "requests_done_hash,requests_queued,requests_running");
  EXPECT_NE(sql_scalar(path_, "SELECT sql FROM sqlite_schema WHERE name = 'requests_done_hash'").find("dedup = 1"),
            std::string::npos);
  EXPECT_NE(sql_scalar(path_, "SELECT sql FROM sqlite_schema WHERE name = 'requests_batch_pending'")
                .find("requests(batch_id)"),
            std::string::npos);
  // The planner still ranges over the partial indexes (the hot queries' terms name their conditions).
  EXPECT_NE(sql_scalar(path_, "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM requests WHERE batch_id = 'b' AND state IN "
                              "('queued','running')")
                .find("requests_batch_pending"),
            std::string::npos);
  EXPECT_NE(sql_scalar(path_, "EXPLAIN QUERY PLAN SELECT id FROM requests WHERE content_hash = 'h' AND "
                              "state = 'done' AND dedup = 1")
                .find("requests_done_hash"),
            std::string::npos);
  EXPECT_EQ(q.pending_in_batch("b"), 4);  // 2 and 7 running, 3 and 5 queued

  // Draining: the dead worker's row (7) comes back at once and is leased after the older queued
  // rows; the live lease (2) stays its holder's.
  auto l = q.lease("w", 2);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].id, 3);
  EXPECT_EQ(l[1].id, 5);
  EXPECT_EQ(q.get(7)->state, RequestState::queued);
  EXPECT_EQ(q.get(2)->worker_id, "w-old");
  q.complete(2, "w-old", Result{200, "{\"text\":\"two\"}", ""});
  EXPECT_EQ(q.cancel_batch("b"), 1);  // row 7, queued again
  EXPECT_EQ(q.get(7)->state, RequestState::cancelled);
  EXPECT_EQ(q.pending_in_batch("b"), 2);  // 3 and 5, running
  auto rest = q.complete_and_lease("w", {{5, Result{200, "{}", ""}}, {3, Result{200, "{\"text\":\"three\"}", ""}}}, 4);
  EXPECT_TRUE(rest.refused.empty());
  ASSERT_EQ(rest.leased.size(), 1u);
  EXPECT_EQ(rest.leased[0].id, 8);
  q.complete(8, "w", Result{200, "{}", ""});
  EXPECT_EQ(q.pending_in_batch("b"), 0);
  EXPECT_TRUE(q.lease("w", 4).empty());
  expect_counts_match_rows(q, path_, "after draining the migrated rows");
  EXPECT_EQ(q.get(3)->result->body, "{\"text\":\"three\"}");
  EXPECT_EQ(q.get(2)->result->body, "{\"text\":\"two\"}");
  // Dedup finds a row v3 finished and one finished after the migration; a queue with dedup off
  // finds neither and its own finished rows are no dedup source.
  RequestId again = q.enqueue("m", body_of(1));
  EXPECT_EQ(q.get(again)->state, RequestState::done);
  EXPECT_EQ(q.get(again)->result->body, "{\"text\":\"one\"}");
  EXPECT_EQ(q.get(q.enqueue("m", body_of(3)))->result->body, "{\"text\":\"three\"}");
  {
    Queue off = Queue::open(path_, QueueOptions{.dedup = false});
    RequestId mine = off.enqueue("m", "{\"prompt\":\"off\"}");
    EXPECT_EQ(off.get(mine)->state, RequestState::queued);
    auto got = off.lease("w-off", 1);
    ASSERT_EQ(got.size(), 1u);
    off.complete(mine, "w-off", Result{200, "{\"text\":\"sampled\"}", ""});
  }
  EXPECT_EQ(q.get(q.enqueue("m", "{\"prompt\":\"off\"}"))->state, RequestState::queued);
  expect_counts_match_rows(q, path_, "after the dedup checks");
  EXPECT_EQ(sql_scalar(path_, "PRAGMA integrity_check"), "ok");
}

// v1 -> v2 -> v3 -> v4 in one open, and a current file reopened migrates nothing.
TEST_F(QueueSchemaTest, V1FileMigratesThroughEveryVersion) {
  sql_exec(path_, std::string(schema_v1_sql()) + "PRAGMA application_id = " + std::to_string(0x434C4D51) +
                      "; PRAGMA user_version = 1;"
                      "INSERT INTO requests(id, model, body, content_hash, state, created_at, updated_at) "
                      "VALUES(1, 'm', '{}', 'h', 'queued', 1, 1);");
  {
    Queue q = Queue::open(path_);
    EXPECT_EQ(q.schema_version(), Queue::kSchemaVersion);
    EXPECT_EQ(q.counts().queued, 1);
  }
  const std::string schema = sql_scalar(path_, "SELECT group_concat(sql, ';') FROM sqlite_schema");
  Queue q = Queue::open(path_);
  EXPECT_EQ(sql_scalar(path_, "SELECT group_concat(sql, ';') FROM sqlite_schema"), schema);
  EXPECT_EQ(q.lease("w", 2).size(), 1u);
}

// The counts are kept by the statements now: after each kind of state change (enqueue, a dedup
// hit, lease, complete, complete_many with a refused row, complete_and_lease, fail back to queued
// and to failed, reclaim of an expired lease, cancel, delete of a batch's rows, a rolled-back
// enqueue) they equal the rows'.
TEST_F(QueueSchemaTest, StateCountsMatchTheRowsAfterEveryKindOfChange) {
  // Leases of 2 s: long enough that no step below loses one by accident on a loaded machine.
  Queue q = Queue::open(path_, QueueOptions{.max_requests = 40, .lease_seconds = 2.0, .max_attempts = 2});
  auto check = [&](const char* what) { expect_counts_match_rows(q, path_, what); };
  for (int i = 0; i < 10; ++i) q.enqueue("m", body_of(i));
  check("enqueue");
  auto l = q.lease("a", 4);
  ASSERT_EQ(l.size(), 4u);
  check("lease");
  q.complete(l[0].id, "a", Result{200, "{\"r\":0}", ""});
  check("complete");
  RequestId dup = q.enqueue("m", body_of(0));  // identical to a done row: stored done at once
  EXPECT_EQ(q.get(dup)->state, RequestState::done);
  check("dedup hit");
  auto other = q.lease("b", 1);
  auto refused = q.complete_many("a", {{l[1].id, Result{200, "{}", ""}}, {other[0].id, Result{200, "{}", ""}}});
  EXPECT_EQ(refused, std::vector<RequestId>{other[0].id});
  check("complete_many with a refused row");
  auto cl = q.complete_and_lease("a", {{l[2].id, Result{200, "{}", ""}}}, 2);
  EXPECT_EQ(cl.leased.size(), 2u);
  check("complete_and_lease");
  EXPECT_EQ(q.fail(l[3].id, "a", "x"), RequestState::queued);
  check("fail back to queued");
  auto again = q.lease("a", 1);
  ASSERT_EQ(again[0].id, l[3].id);
  EXPECT_EQ(q.fail(l[3].id, "a", "y"), RequestState::failed);
  check("fail out of attempts");
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_GE(q.reclaim(), 3);  // b's row and a's two from complete_and_lease
  check("reclaim of expired leases");
  // A batch: its queued rows cancelled, then its rows deleted with its last output file.
  auto batch_rows = [](int from, int n) {
    std::vector<NewRequest> v;
    for (int i = from; i < from + n; ++i) v.push_back({"m", body_of(i)});
    return v;
  };
  FileInfo in = q.add_file("batch", "in.jsonl", "{}\n");
  BatchInfo b = q.create_batch(in.id, "/v1/completions", "24h");
  ASSERT_TRUE(q.start_batch(b.id, batch_rows(100, 5)));
  check("start_batch");
  auto bl = q.lease("c", 50);
  ASSERT_FALSE(bl.empty());
  std::vector<std::pair<RequestId, Result>> acks;
  for (const auto& r : bl)
    if (r.batch_id == b.id && acks.size() < 2) acks.push_back({r.id, Result{200, "{}", ""}});
  ASSERT_EQ(acks.size(), 2u);
  q.complete_many("c", acks);
  for (const auto& r : bl)
    if (r.batch_id == b.id && r.id != acks[0].first && r.id != acks[1].first) q.fail(r.id, "c", "back");
  EXPECT_EQ(q.pending_in_batch(b.id), 3);
  EXPECT_EQ(q.cancel_batch(b.id), 3);
  EXPECT_EQ(q.pending_in_batch(b.id), 0);
  check("cancel_batch");
  ASSERT_TRUE(q.finish_batch(b.id, BatchStatus::in_progress, BatchStatus::cancelled, 10, -1));
  auto done_batch = q.get_batch(b.id);
  ASSERT_TRUE(done_batch && done_batch->output_file_id);
  EXPECT_EQ(done_batch->counts.total, 5);
  ASSERT_TRUE(q.delete_file(*done_batch->output_file_id));
  EXPECT_EQ(q.counts(b.id).total(), 0);
  check("delete of a batch's rows");
  // A refused enqueue (full) and a refused duplicate custom_id roll back and count nothing.
  const Counts before = q.counts();
  EXPECT_THROW(q.enqueue_many(batch_rows(200, 40)), QueueFullError);
  EXPECT_THROW(q.enqueue_many({{"m", body_of(300), std::string("bb"), std::string("same")},
                               {"m", body_of(301), std::string("bb"), std::string("same")}}),
               corelm::ValueError);
  EXPECT_EQ(q.counts().total(), before.total());
  check("rolled-back enqueues");
}

// complete_and_lease: the held rows are stored, a row whose lease is gone is refused (not
// stored), the next rows are leased oldest first; n == 0 only acks, no results only leases.
TEST_F(QueueSchemaTest, CompleteAndLeaseAcksAndRefillsInOneCall) {
  Queue q = Queue::open(path_);
  for (int i = 0; i < 8; ++i) q.enqueue("m", body_of(i));
  auto mine = q.lease("a", 2);
  auto theirs = q.lease("b", 1);
  auto got = q.complete_and_lease(
      "a", {{mine[0].id, Result{200, "{\"n\":1}", ""}}, {mine[1].id, Result{400, "{}", "bad"}},
            {theirs[0].id, Result{200, "{\"stolen\":1}", ""}}},
      3);
  EXPECT_EQ(got.refused, std::vector<RequestId>{theirs[0].id});
  ASSERT_EQ(got.leased.size(), 3u);
  EXPECT_EQ(got.leased[0].id, 4);
  EXPECT_EQ(got.leased[2].id, 6);
  EXPECT_EQ(got.leased[0].attempts, 1);
  EXPECT_EQ(q.get(mine[0].id)->result->body, "{\"n\":1}");
  EXPECT_EQ(q.get(mine[1].id)->result->error, "bad");
  EXPECT_EQ(q.get(theirs[0].id)->state, RequestState::running);
  EXPECT_FALSE(q.get(theirs[0].id)->result.has_value());
  EXPECT_EQ(q.get(4)->worker_id, "a");
  auto only_ack = q.complete_and_lease("a", {{4, Result{200, "{}", ""}}}, 0);
  EXPECT_TRUE(only_ack.leased.empty());
  EXPECT_EQ(q.get(4)->state, RequestState::done);
  auto only_lease = q.complete_and_lease("a", {}, 5);
  ASSERT_EQ(only_lease.leased.size(), 2u);
  EXPECT_EQ(only_lease.leased[0].id, 7);
  EXPECT_THROW(q.complete_and_lease("a", {}, -1), corelm::ValueError);
  EXPECT_THROW(q.complete_and_lease("", {}, 1), corelm::ValueError);
  RequestId late = q.enqueue("m", body_of(9));
  EXPECT_THROW(q.complete_and_lease("a", {{999, Result{200, "{}", ""}}}, 1), corelm::IndexError);
  EXPECT_EQ(q.get(late)->state, RequestState::queued);  // the failed call is rolled back whole
  Counts c = q.counts();
  EXPECT_EQ(c.done, 3);
  EXPECT_EQ(c.running, 5);
  EXPECT_EQ(c.queued, 1);
}

// A worker that acks and refills with complete_and_lease, killed with -9 at random moments: every
// result it reported (after the call returned) is on disk once with its body, no row is lost or
// run twice into two results, the counts match the rows, and the file is consistent.
TEST_F(QueueSchemaTest, KillNineDuringCompleteAndLeaseLosesAndDuplicatesNothing) {
  constexpr int N = 400;
  {
    Queue q = Queue::open(path_);
    std::vector<NewRequest> reqs;
    for (int i = 0; i < N; ++i) reqs.push_back({"m", body_of(i)});
    q.enqueue_many(reqs);
  }
  auto result_of = [](RequestId id) { return Result{200, killed_worker_body(id), ""}; };
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 3; ++round) {
    const std::string reported = run_and_kill_worker(rng, [&](int report) {
      Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 3600});
      auto held = q.lease("victim", 4);
      while (!held.empty()) {
        std::vector<std::pair<RequestId, Result>> acks;
        for (const auto& r : held) acks.push_back({r.id, result_of(r.id)});
        AckAndLease got = q.complete_and_lease("victim", acks, 4);
        if (!got.refused.empty()) _exit(4);
        for (const auto& a : acks) report_done(report, a.first);  // only once complete_and_lease returned
        held = std::move(got.leased);
      }
    });
    EXPECT_EQ(sql_scalar(path_, "PRAGMA integrity_check"), "ok");
    Queue q = Queue::open(path_, QueueOptions{.lease_seconds = 3600});
    expect_reported_done(q, reported);
    q.reclaim();  // the victim's leases come back at once (its pid is gone)
    expect_counts_match_rows(q, path_, "after kill -9 round " + std::to_string(round));
    Counts c = q.counts();
    EXPECT_EQ(c.running, 0);
    EXPECT_EQ(c.total(), N);
    EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(*) FROM results"), std::to_string(c.done));
  }
  Queue q = Queue::open(path_);
  for (auto held = q.lease("parent", 64); !held.empty();) {
    std::vector<std::pair<RequestId, Result>> acks;
    for (const auto& r : held) acks.push_back({r.id, result_of(r.id)});
    AckAndLease got = q.complete_and_lease("parent", acks, 64);
    EXPECT_TRUE(got.refused.empty());
    held = std::move(got.leased);
  }
  EXPECT_EQ(q.counts().done, N);
  expect_counts_match_rows(q, path_, "after the drain");
  EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(DISTINCT request_id) FROM results"), std::to_string(N));
  EXPECT_EQ(sql_scalar(path_, "SELECT COUNT(*) FROM results s JOIN requests r ON r.id = s.request_id "
                              "WHERE s.body <> '{\"id\":' || r.id || '}'"), "0");
}
