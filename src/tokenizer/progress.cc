#include "tokenizer/progress.h"

#include <cstdio>

namespace corelm::tok {

Progress::Progress(std::string label, uint64_t total_bytes, bool enabled)
    : label_(std::move(label)), total_(total_bytes), enabled_(enabled), start_(std::chrono::steady_clock::now()),
      last_(start_) {}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(uint64_t done, uint64_t tokens, bool force) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_ < std::chrono::milliseconds(250)) return;
  last_ = now;
  double secs = std::max(1e-9, elapsed());
  double mb_s = done / secs / 1e6;
  double frac = total_ ? static_cast<double>(done) / total_ : 0.0;
  int width = 30, filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.resize(width, '.');
  double eta = done && total_ > done ? (total_ - done) / (done / secs) : 0.0;
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %.1f/%.1f MB  %.1f MB/s  %.0f tok/s  ETA %.0fs   ", label_.c_str(),
               bar.c_str(), frac * 100, done / 1e6, total_ / 1e6, mb_s, tokens / secs, eta);
  std::fflush(stderr);
}

void Progress::finish(uint64_t done, uint64_t tokens) {
  if (!enabled_) return;
  update(done, tokens, true);
  std::fprintf(stderr, "\n");
}

}  // namespace corelm::tok
