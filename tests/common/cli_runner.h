// Runs the real `corelm` binary (or any program) as a child process with a time limit and
// returns its exit code and output: the fault and bad-input tests drive the CLI exactly as a
// user would. A child still running at the limit is killed and reported as timed_out, so a
// hang fails the test instead of hanging the suite.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace corelm::testing {

struct CliResult {
  int rc = -1;           // exit code, or 128 + signal
  bool timed_out = false;
  std::string out, err;  // stdout, stderr
  std::string all() const { return out + err; }
};

struct CliOptions {
  double timeout_s = 120;
  std::vector<std::string> env{};  // "NAME=value" added to the environment
  long fsize_limit = -1;         // RLIMIT_FSIZE in bytes (writes past it fail with EFBIG)
  long as_limit = -1;            // RLIMIT_AS in bytes
  std::string stdin_data{};
};

inline std::string corelm_path() { return std::string(CORELM_BINARY_DIR) + "/corelm"; }

// In a forked child: applies opt's limits and environment, then execs `program args...` (no shell;
// program "" means the corelm binary). Never returns (exit 127 when the exec fails).
[[noreturn]] inline void exec_child(const std::string& program, const std::vector<std::string>& args,
                                    const CliOptions& opt) {
  if (opt.fsize_limit >= 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of killing
    rlimit r{static_cast<rlim_t>(opt.fsize_limit), static_cast<rlim_t>(opt.fsize_limit)};
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  if (opt.as_limit >= 0) {
    rlimit r{static_cast<rlim_t>(opt.as_limit), static_cast<rlim_t>(opt.as_limit)};
    ::setrlimit(RLIMIT_AS, &r);
  }
  for (const auto& e : opt.env) ::putenv(const_cast<char*>(e.c_str()));
  std::vector<std::string> full{program.empty() ? corelm_path() : program};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  ::_exit(127);
}

// Runs `program args...` (no shell). program "" means the corelm binary.
inline CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                             const CliOptions& opt = {}) {
  int out_p[2], err_p[2], in_p[2];
  if (::pipe(out_p) || ::pipe(err_p) || ::pipe(in_p)) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(in_p[0], 0);
    ::dup2(out_p[1], 1);
    ::dup2(err_p[1], 2);
    for (int fd : {in_p[0], in_p[1], out_p[0], out_p[1], err_p[0], err_p[1]}) ::close(fd);
    exec_child(program, args, opt);
  }
  ::close(in_p[0]);
  ::close(out_p[1]);
  ::close(err_p[1]);
  if (!opt.stdin_data.empty()) {
    ::signal(SIGPIPE, SIG_IGN);
    (void)!::write(in_p[1], opt.stdin_data.data(), opt.stdin_data.size());
  }
  ::close(in_p[1]);
  CliResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opt.timeout_s);
  pollfd fds[2] = {{out_p[0], POLLIN, 0}, {err_p[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    if (::poll(fds, 2, static_cast<int>(std::min<long>(left.count(), 1000))) < 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline CliResult run_corelm(const std::vector<std::string>& args, const CliOptions& opt = {}) {
  return run_program("", args, opt);
}

// Starts `corelm args...` (or `program args...`) in the background, stdout and stderr to `log`;
// returns its pid for wait_exit (or a kill first).
inline pid_t spawn_corelm(const std::vector<std::string>& args, const std::string& log, long fsize_limit = -1,
                          const std::vector<std::string>& extra_env = {}, const std::string& program = "") {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (FILE* f = std::fopen(log.c_str(), "w")) {
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
    }
    CliOptions opt;
    opt.fsize_limit = fsize_limit;
    opt.env = extra_env;
    exec_child(program, args, opt);
  }
  return pid;
}

// The exit code of a spawned child, or 128 + the signal that ended it.
inline int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// True when a program is on PATH (for tests that skip without strace, mount privileges, ...).
inline bool have_program(const std::string& name) {
  return std::system(("command -v " + name + " > /dev/null 2>&1").c_str()) == 0;
}

// A whole file's bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The names in a folder, sorted (to assert that nothing was left behind).
inline std::vector<std::string> names(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A fresh folder per test, removed afterwards.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() / ("corelm_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace corelm::testing
