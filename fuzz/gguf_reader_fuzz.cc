// Fuzz target: arbitrary bytes as a GGUF file. Opening must either succeed or throw a
// corelm::Error; in a file that opens, every tensor must be readable (views and dequantisation
// stay inside the mapping) and the llama model loader must again succeed or throw cleanly.
#include <cstdint>
#include <cstdlib>

#include "corelm/error.h"
#include "corelm/gguf.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = corelm::fuzz::write_input(data, size, ".gguf");
  try {
    corelm::io::GGUFFile f = corelm::io::GGUFFile::open(path);
    for (const auto& info : f.tensors()) {
      corelm::Tensor t = f.get(info.name);
      int64_t n = 1;
      for (int64_t d : info.ne) n *= d;
      if (t.numel() != n) std::abort();  // a view or dequantised copy of exactly the declared size
    }
    corelm::io::load_gguf_model(path);
  } catch (const corelm::Error&) {
  }
  return 0;
}
