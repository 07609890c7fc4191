// One progress line on stderr (rewritten in place): done/total bytes, MB/s, tokens/s, ETA.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace corelm::tok {

class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes, bool enabled);
  void update(uint64_t done_bytes, uint64_t tokens, bool force = false);
  void finish(uint64_t done_bytes, uint64_t tokens);
  double elapsed() const;

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace corelm::tok
