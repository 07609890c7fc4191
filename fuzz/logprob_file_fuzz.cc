// libFuzzer target: the --kl-base log-probability file reader (src/pipeline/logprob_file.h). Any
// bytes either open as a base file -- and then every chunk reads, or fails with a corelm::Error --
// or are refused with a corelm::Error; no crash, no unbounded allocation (the header must agree
// with the file size before anything is allocated).
#include <cstdint>
#include <vector>

#include "corelm/error.h"
#include "fuzz_file.h"
#include "pipeline/logprob_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = corelm::fuzz::write_input(data, size, ".bin");
  try {
    corelm::pipeline::LogProbReader r(path);
    const auto& h = r.header();
    if (r.tokens().size() != size_t{h.n_chunk} * h.n_ctx) __builtin_trap();
    std::vector<float> rows;
    for (uint32_t c = 0; c < h.n_chunk; ++c) r.read_chunks(1, rows);
  } catch (const corelm::Error&) {
  }
  return 0;
}
