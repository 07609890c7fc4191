// kill -9 tests of the queue: a forked worker that reports each request id it finished (one line
// per id, written only after the queue call that made it durable returned) is killed at a random
// moment; the parent then checks that every reported id is done with its result on disk.
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "corelm/queue.h"

namespace corelm::queue {

// The result body the killed workers store for request `id`.
inline std::string killed_worker_body(RequestId id) { return "{\"id\":" + std::to_string(id) + "}"; }

// Writes "id\n" to the report pipe (the child exits 3 when the write fails).
inline void report_done(int fd, RequestId id) {
  const std::string line = std::to_string(id) + "\n";
  if (::write(fd, line.data(), line.size()) < 0) _exit(3);
}

// Forks a child running body(report_fd) (exit 2 on an exception, 0 when it returns), sends it
// SIGKILL after 20-120 ms and returns everything it reported.
inline std::string run_and_kill_worker(std::mt19937& rng, const std::function<void(int)>& body) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    try {
      body(fds[1]);
    } catch (...) {
      _exit(2);
    }
    _exit(0);
  }
  ::close(fds[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(20, 120)(rng)));
  ::kill(pid, SIGKILL);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "the worker failed: " << WEXITSTATUS(status);
  std::string reported;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) reported.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  return reported;
}

// Every id the worker reported is done, with the body it stored.
inline void expect_reported_done(Queue& q, const std::string& reported) {
  std::istringstream in(reported);
  int64_t id;
  while (in >> id) {
    auto info = q.get(id);
    ASSERT_TRUE(info.has_value() && info->result.has_value()) << "reported request " << id;
    EXPECT_EQ(info->state, RequestState::done) << "reported request " << id;
    EXPECT_EQ(info->result->body, killed_worker_body(id));
  }
}

}  // namespace corelm::queue
