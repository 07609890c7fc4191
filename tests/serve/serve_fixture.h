// Shared set-up for the server tests: small random decoders with a byte-level BPE tokenizer
// trained in the test, saved as model folders; the real `corelm serve` as a child process (port
// 0, the port read from its "listening on" line); small HTTP helpers over raw sockets for the
// cases a well-behaved client cannot produce (disconnects, partial headers).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_runner.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"

namespace corelm::testing {
namespace fs = std::filesystem;

inline std::string serve_words(std::mt19937& rng, int n) {
  static const char* vocab[] = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "river", "stone",
                                "market", "prices", "rose", "team", "won", "game", "new", "chip", "storm", "night"};
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += vocab[rng() % (sizeof(vocab) / sizeof(vocab[0]))];
  }
  return s;
}

struct ModelShape {
  int64_t hidden = 32, intermediate = 64, layers = 2, heads = 2, kv_heads = 1, head_dim = 16, context = 96;
};
// "slow" enough that a request of a few thousand tokens runs for seconds (queue-full, drain,
// disconnect tests), still tiny on disk.
inline ModelShape slow_shape() { return {256, 768, 6, 4, 2, 64, 4096}; }

// A model folder: tokenizer.json (BPE, ~320 tokens, <|endoftext|> its EOS) + config.json +
// model.safetensors. Returns the EOS id, for a logit_bias that keeps random weights from
// stopping early where a test needs a run of a known length.
inline int make_model_dir(const fs::path& dir, const ModelShape& s = {}, uint64_t seed = 11) {
  fs::create_directories(dir);
  const fs::path corpus = dir.parent_path() / (dir.filename().string() + "_corpus.txt");
  {
    std::mt19937 rng(7);
    std::ofstream out(corpus, std::ios::binary);
    for (int i = 0; i < 300; ++i) out << serve_words(rng, 12) << "\n";
  }
  BpeTrainOptions bpe;
  bpe.vocab_size = 320;
  train_bpe({corpus.string()}, bpe, (dir / "tokenizer.json").string());
  fs::remove(corpus);
  auto tok = Tokenizer::load((dir / "tokenizer.json").string());
  model::ModelConfig c;
  c.vocab_size = static_cast<int64_t>(tok->vocab_size());
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.max_position_embeddings = s.context;
  c.initializer_range = 0.2;
  model::Decoder d(c);
  d.init_weights(seed);
  model::save_model_dir(dir.string(), d);
  return tok->eos_id() ? static_cast<int>(*tok->eos_id()) : -1;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `corelm serve ...` in the background; killed (SIGKILL) by the destructor if still running.
class ServerProcess {
 public:
  ServerProcess(const std::vector<std::string>& args, const fs::path& log) : log_(log) {
    std::vector<std::string> full{"serve", "--port", "0"};
    full.insert(full.end(), args.begin(), args.end());
    pid_ = spawn_corelm(full, log.string());
  }
  ~ServerProcess() { kill(SIGKILL); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // The port from the "listening on" line, or -1 after `timeout_s`.
  int wait_port(double timeout_s = 20) {
    static const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string text = read_text(log_);
      if (std::regex_search(text, m, re)) return port_ = std::stoi(m[1]);
      if (!running()) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pid_ = -1;
      return false;
    }
    return true;
  }
  void kill(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
    if (sig == SIGKILL && pid_ > 0) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      exit_code_ = 128 + SIGKILL;
      pid_ = -1;
    }
  }
  // Waits for the exit; -1 at the timeout.
  int wait_exit(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (running()) {
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }  // -1 once it has exited
  std::string log() const { return read_text(log_); }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  int port_ = -1;
  int exit_code_ = -1;
};

// A TCP connection to 127.0.0.1:port (-1 on failure).
inline int connect_local(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `needle` appears, the peer closes, or the timeout; returns what was read.
inline std::string recv_until(int fd, const std::string& needle, double timeout_s, bool* closed = nullptr) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  if (closed) *closed = false;
  char buf[4096];
  while (needle.empty() || got.find(needle) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

inline std::string http_post_raw(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace corelm::testing
