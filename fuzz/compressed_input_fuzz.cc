// Fuzz target: arbitrary bytes as a corpus input file for `corelm run` (plain, gzip with any number
// of members, or zstd, told apart by magic bytes as for a user's file). Reading every line must
// either succeed or throw a corelm::Error naming the file; no line may exceed the byte limit and
// the decompressed offset only grows. Seeds: fuzz/seeds/compressed (valid, multi-member and
// padded files the mutations start from).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "corelm/error.h"
#include "fuzz_file.h"
#include "pipeline/input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = corelm::fuzz::write_input(data, size, ".jsonl");
  constexpr int64_t kMaxLine = 256;
  try {
    corelm::pipeline::LineReader reader(path, kMaxLine);
    std::string line;
    bool too_long = false;
    uint64_t last_offset = 0;
    int64_t lines = 0;
    while (reader.next(line, too_long)) {
      if (static_cast<int64_t>(line.size()) > kMaxLine) std::abort();
      if (too_long && !line.empty()) std::abort();
      if (reader.offset() < last_offset) std::abort();
      last_offset = reader.offset();
      if (reader.line_number() != ++lines) std::abort();
    }
  } catch (const corelm::Error&) {
  }
  return 0;
}
