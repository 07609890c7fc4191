// The queue's files and batches: uploads, the batch state machine as conditional transitions,
// all-or-nothing and race-free start, counts, streaming of results, and purge with the output.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "corelm/queue.h"
#include "queue/queue_dir_fixture.h"

using namespace corelm::queue;

namespace {

using BatchQueueTest = QueueDirTest;

std::vector<NewRequest> rows(int n, int from = 0) {
  std::vector<NewRequest> out;
  for (int i = from; i < from + n; ++i)
    out.push_back(NewRequest{"m", "{\"prompt\":\"p" + std::to_string(i) + "\"}", std::nullopt, "c" + std::to_string(i)});
  return out;
}

template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected exception not thrown";
  return {};
}

}  // namespace

TEST_F(BatchQueueTest, FilesAreStoredListedNewestFirstAndDeleted) {
  Queue q = Queue::open(path_);
  std::string binary("a\0b\n", 4);
  FileInfo a = q.add_file("batch", "a.jsonl", binary);
  FileInfo b = q.add_file("batch", "b.jsonl", "{}\n");
  FileInfo c = q.add_file("batch", "c.jsonl", "");
  EXPECT_EQ(a.id.size(), 5u + 24u);
  EXPECT_EQ(a.id.substr(0, 5), "file-");
  EXPECT_NE(a.id, b.id);
  EXPECT_EQ(a.bytes, 4);
  auto got = q.get_file(a.id);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->filename, "a.jsonl");
  EXPECT_EQ(got->purpose, "batch");
  EXPECT_EQ(got->kind, FileKind::upload);
  EXPECT_EQ(q.file_content(a.id), binary);
  EXPECT_EQ(q.file_content(c.id), "");
  auto all = q.list_files();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].id, c.id);
  EXPECT_EQ(all[2].id, a.id);
  auto page = q.list_files(c.id, 1);
  ASSERT_EQ(page.size(), 1u);
  EXPECT_EQ(page[0].id, b.id);
  EXPECT_TRUE(q.delete_file(b.id));
  EXPECT_FALSE(q.delete_file(b.id));
  EXPECT_FALSE(q.get_file(b.id));
  EXPECT_FALSE(q.file_content(b.id));
  EXPECT_EQ(q.list_files().size(), 2u);
  EXPECT_THROW(q.list_files(std::nullopt, 0), corelm::ValueError);
}

TEST_F(BatchQueueTest, CreateBatchChecksItsArguments) {
  Queue q = Queue::open(path_);
  FileInfo f = q.add_file("batch", "in.jsonl", "");
  FileInfo other = q.add_file("fine-tune", "x.jsonl", "");
  BatchInfo b = q.create_batch(f.id, "/v1/chat/completions", "48h", R"({"project":"x"})");
  EXPECT_EQ(b.id.substr(0, 6), "batch_");
  EXPECT_EQ(b.status, BatchStatus::validating);
  EXPECT_EQ(b.endpoint, "/v1/chat/completions");
  EXPECT_EQ(b.metadata, R"({"project":"x"})");
  ASSERT_TRUE(b.expires_at);
  EXPECT_NEAR(*b.expires_at - b.created_at, 48 * 3600.0, 1e-3);
  EXPECT_FALSE(b.in_progress_at);
  EXPECT_EQ(b.counts.total, 0);
  EXPECT_NE(message_of<NotFoundError>([&] { q.create_batch("file-nope", "/v1/completions", "24h"); }).find("file-nope"),
            std::string::npos);
  EXPECT_NE(message_of<corelm::ValueError>([&] { q.create_batch(other.id, "/v1/completions", "24h"); }).find("purpose"),
            std::string::npos);
  EXPECT_NE(message_of<corelm::ValueError>([&] { q.create_batch(f.id, "/v1/embeddings", "24h"); }).find("/v1/embeddings"),
            std::string::npos);
  for (const char* w : {"", "24", "0h", "1d", "9999h", "h", "-1h"})
    EXPECT_NE(message_of<corelm::ValueError>([&] { q.create_batch(f.id, "/v1/completions", w); }).find("completion_window"),
              std::string::npos)
        << w;
  const std::string long_value = R"({"k":")" + std::string(513, 'x') + "\"}";
  const std::string long_key = "{\"" + std::string(65, 'k') + "\":\"v\"}";
  for (const std::string& md : {std::string("[1]"), std::string("{\"a\":1}"), std::string("{bad"), long_value, long_key})
    EXPECT_THROW(q.create_batch(f.id, "/v1/completions", "24h", md), corelm::ValueError) << md;
  EXPECT_EQ(q.create_batch(f.id, "/v1/completions", "24h", "null").metadata, "");
  auto listed = q.list_batches();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[1].id, b.id);  // newest first
  EXPECT_EQ(q.list_batches(listed[0].id, 5).size(), 1u);
}

TEST_F(BatchQueueTest, LifecycleCountsResultsFilesAndPurge) {
  QueueOptions o;
  o.max_attempts = 1;
  Queue q = Queue::open(path_, o);
  FileInfo f = q.add_file("batch", "in.jsonl", "...");
  BatchInfo b = q.create_batch(f.id, "/v1/completions", "24h");
  ASSERT_TRUE(q.start_batch(b.id, rows(5)));
  EXPECT_FALSE(q.start_batch(b.id, rows(5)));  // already started: not enqueued twice
  BatchInfo s = *q.get_batch(b.id);
  EXPECT_EQ(s.status, BatchStatus::in_progress);
  EXPECT_TRUE(s.in_progress_at);
  EXPECT_EQ(s.counts.total, 5);
  EXPECT_EQ(q.counts(b.id).queued, 5);
  EXPECT_EQ(q.batches_in(BatchStatus::in_progress), std::vector<std::string>{b.id});

  auto l = q.lease("w", 10);
  ASSERT_EQ(l.size(), 5u);
  for (const auto& r : l) EXPECT_EQ(r.batch_id, b.id);
  q.complete_many("w", {{l[0].id, Result{200, R"({"text":"0"})", ""}},
                        {l[1].id, Result{200, R"({"text":"1"})", ""}},
                        {l[2].id, Result{400, R"({"error":{"message":"bad"}})", ""}}});
  EXPECT_EQ(q.fail(l[3].id, "w", "boom"), RequestState::failed);
  // Not finalizable while a row runs: the caller checks counts(batch).running/queued.
  EXPECT_EQ(q.counts(b.id).running, 1);
  EXPECT_EQ(q.pending_in_batch(b.id), 1);
  EXPECT_EQ(q.get_batch(b.id, /*with_counts=*/false)->counts.total, 0);
  q.complete(l[4].id, "w", Result{200, R"({"text":"4"})", ""});
  EXPECT_EQ(q.pending_in_batch(b.id), 0);
  BatchCounts c = q.get_batch(b.id)->counts;
  EXPECT_EQ(c.total, 5);
  EXPECT_EQ(c.completed, 3);
  EXPECT_EQ(c.failed, 2);

  EXPECT_FALSE(q.transition_batch(b.id, BatchStatus::validating, BatchStatus::in_progress));
  ASSERT_TRUE(q.transition_batch(b.id, BatchStatus::in_progress, BatchStatus::finalizing));
  EXPECT_FALSE(q.transition_batch(b.id, BatchStatus::in_progress, BatchStatus::finalizing));
  std::vector<BatchRow> seen;
  q.for_each_result(b.id, [&](const BatchRow& r) {
    seen.push_back(r);
    return true;
  });
  ASSERT_EQ(seen.size(), 5u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].custom_id, "c" + std::to_string(i));
    ASSERT_TRUE(seen[i].result);
  }
  EXPECT_EQ(seen[2].result->status_code, 400);
  EXPECT_EQ(seen[3].state, RequestState::failed);
  EXPECT_NE(seen[3].result->error.find("boom"), std::string::npos);

  ASSERT_TRUE(q.finish_batch(b.id, BatchStatus::finalizing, BatchStatus::completed, 123, 45));
  EXPECT_FALSE(q.finish_batch(b.id, BatchStatus::finalizing, BatchStatus::completed, 123, 45));
  BatchInfo done = *q.get_batch(b.id);
  EXPECT_EQ(done.status, BatchStatus::completed);
  EXPECT_TRUE(done.finalizing_at && done.completed_at);
  ASSERT_TRUE(done.output_file_id && done.error_file_id);
  FileInfo out = *q.get_file(*done.output_file_id);
  EXPECT_EQ(out.purpose, "batch_output");
  EXPECT_EQ(out.kind, FileKind::output);
  EXPECT_EQ(out.bytes, 123);
  EXPECT_EQ(out.batch_id, b.id);
  EXPECT_FALSE(q.file_content(out.id));  // rendered by the API, not stored
  EXPECT_EQ(q.get_file(*done.error_file_id)->kind, FileKind::error);

  // The rows go with the last result file; the batch keeps its frozen counts.
  EXPECT_TRUE(q.delete_file(*done.output_file_id));
  EXPECT_EQ(q.counts(b.id).total(), 5);
  EXPECT_TRUE(q.delete_file(*done.error_file_id));
  EXPECT_EQ(q.counts(b.id).total(), 0);
  EXPECT_EQ(q.counts().total(), 0);
  EXPECT_EQ(q.get_batch(b.id)->counts.completed, 3);
  EXPECT_EQ(q.get_batch(b.id)->counts.failed, 2);
  EXPECT_TRUE(q.get_file(f.id));  // the input stays
}

TEST_F(BatchQueueTest, StartBatchIsAllOrNothing) {
  QueueOptions o;
  o.max_requests = 4;
  Queue q = Queue::open(path_, o);
  FileInfo f = q.add_file("batch", "in.jsonl", "");
  BatchInfo b = q.create_batch(f.id, "/v1/completions", "24h");
  EXPECT_THROW(q.start_batch(b.id, rows(5)), QueueFullError);
  EXPECT_EQ(q.counts().total(), 0);
  EXPECT_EQ(q.get_batch(b.id)->status, BatchStatus::validating);
  auto dup = rows(2);
  dup[1].custom_id = dup[0].custom_id;
  EXPECT_THROW(q.start_batch(b.id, dup), corelm::ValueError);
  EXPECT_EQ(q.counts().total(), 0);
  EXPECT_EQ(q.get_batch(b.id)->status, BatchStatus::validating);
  EXPECT_THROW(q.start_batch("batch_nope", rows(1)), NotFoundError);
  ASSERT_TRUE(q.start_batch(b.id, rows(4)));
  EXPECT_EQ(q.counts().queued, 4);
}

TEST_F(BatchQueueTest, FailCancelAndExpireAreConditional) {
  Queue q = Queue::open(path_);
  FileInfo f = q.add_file("batch", "in.jsonl", "");
  BatchInfo bad = q.create_batch(f.id, "/v1/completions", "24h");
  std::string errors = R"({"object":"list","data":[{"code":"invalid_json","line":1,"message":"x","param":null}]})";
  ASSERT_TRUE(q.fail_batch(bad.id, errors));
  EXPECT_FALSE(q.fail_batch(bad.id, errors));
  EXPECT_FALSE(q.start_batch(bad.id, rows(2)));
  BatchInfo fb = *q.get_batch(bad.id);
  EXPECT_EQ(fb.status, BatchStatus::failed);
  EXPECT_EQ(nlohmann::json::parse(fb.errors), nlohmann::json::parse(errors));
  EXPECT_TRUE(fb.failed_at);
  EXPECT_EQ(q.counts().total(), 0);

  BatchInfo b = q.create_batch(f.id, "/v1/completions", "24h");
  ASSERT_TRUE(q.start_batch(b.id, rows(4)));
  auto l = q.lease("w", 1);
  ASSERT_TRUE(q.transition_batch(b.id, BatchStatus::in_progress, BatchStatus::cancelling));
  EXPECT_TRUE(q.get_batch(b.id)->cancelling_at);
  EXPECT_EQ(q.cancel_batch(b.id), 3);
  q.complete(l[0].id, "w", Result{200, "{}", ""});  // the running one finishes
  ASSERT_TRUE(q.finish_batch(b.id, BatchStatus::cancelling, BatchStatus::cancelled, 10, 20));
  BatchInfo cb = *q.get_batch(b.id);
  EXPECT_EQ(cb.status, BatchStatus::cancelled);
  EXPECT_EQ(cb.counts.completed, 1);
  EXPECT_EQ(cb.counts.failed, 3);  // cancelled before they ran: in the error file
  int cancelled = 0;
  q.for_each_result(b.id, [&](const BatchRow& r) {
    if (r.state == RequestState::cancelled) {
      ++cancelled;
      EXPECT_FALSE(r.result);
    }
    return true;
  });
  EXPECT_EQ(cancelled, 3);
  EXPECT_THROW(q.finish_batch(b.id, BatchStatus::cancelled, BatchStatus::finalizing, 0, 0), corelm::ValueError);
}

TEST_F(BatchQueueTest, ForEachResultPagesInIdOrderAndStops) {
  Queue q = Queue::open(path_);
  FileInfo f = q.add_file("batch", "in.jsonl", "");
  BatchInfo b = q.create_batch(f.id, "/v1/completions", "24h");
  q.enqueue("m", "{\"other\":1}");  // rows of no batch are not streamed
  ASSERT_TRUE(q.start_batch(b.id, rows(700)));
  std::vector<std::pair<RequestId, Result>> results;
  for (auto& r : q.lease("w", 701)) results.push_back({r.id, Result{200, "{\"i\":" + std::to_string(r.id) + "}", ""}});
  ASSERT_TRUE(q.complete_many("w", results).empty());
  RequestId prev = 0;
  int n = 0;
  q.for_each_result(b.id, [&](const BatchRow& r) {
    EXPECT_GT(r.id, prev);
    prev = r.id;
    ++n;
    return true;
  });
  EXPECT_EQ(n, 700);
  n = 0;
  q.for_each_result(b.id, [&](const BatchRow&) { return ++n < 300; });
  EXPECT_EQ(n, 300);
}

// Two processes validate the same batch at once (two servers on one state dir): one enqueues.
TEST_F(BatchQueueTest, TwoProcessesStartingOneBatchEnqueueItOnce) {
  std::string id;
  {
    Queue q = Queue::open(path_);
    id = q.create_batch(q.add_file("batch", "in.jsonl", "").id, "/v1/completions", "24h").id;
  }
  std::vector<pid_t> kids;
  for (int k = 0; k < 2; ++k) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        Queue q = Queue::open(path_);
        rc = q.start_batch(id, rows(300)) ? 10 : 11;
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  std::multiset<int> codes;
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    codes.insert(WEXITSTATUS(status));
  }
  EXPECT_EQ(codes, (std::multiset<int>{10, 11}));
  Queue q = Queue::open(path_);
  EXPECT_EQ(q.counts(id).queued, 300);
  EXPECT_EQ(q.get_batch(id)->status, BatchStatus::in_progress);
}
