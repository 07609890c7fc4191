// Fuzz target: arbitrary bytes as a safetensors file. Opening must either succeed or throw a
// corelm::Error; a file that opens must hand out every tensor, and reading each one's bytes must
// stay inside the mapping (ASan checks that).
#include <cstdint>
#include <cstdlib>

#include "corelm/error.h"
#include "corelm/safetensors.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = corelm::fuzz::write_input(data, size, ".safetensors");
  try {
    corelm::io::SafetensorsFile f = corelm::io::SafetensorsFile::open(path);
    for (const std::string& name : f.names()) {
      corelm::Tensor t = f.get(name);
      const auto* bytes = static_cast<const uint8_t*>(t.raw_data());
      const size_t n = static_cast<size_t>(t.numel()) * corelm::dtype_size(t.dtype());
      unsigned sum = 0;
      for (size_t i = 0; i < n; ++i) sum += bytes[i];
      if (sum == 0xFFFFFFFFu) std::abort();  // keeps the reads from being optimised away
    }
  } catch (const corelm::Error&) {
  }
  return 0;
}
