// Fuzz target: arbitrary bytes as a GGUF file. Opening must either succeed or throw a
// corelm::Error; in a file that opens, every tensor must be readable (views and dequantisation
// stay inside the mapping), every metadata array must read back through its accessors, and the
// llama model loader must again succeed or throw cleanly.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "corelm/architecture.h"
#include "corelm/error.h"
#include "corelm/gguf.h"
#include "fuzz_file.h"

namespace {

// Reads back a value the way consumers do (typed accessors, element copies for nested arrays):
// decoding must stay inside the stored bytes whatever the file held. Type mismatches throw
// corelm::Error, which the caller ignores.
void touch(const corelm::io::GGUFValue& v, int depth) {
  using T = corelm::io::GGUFType;
  if (v.type != T::Array) return;
  const corelm::io::GGUFArray& a = v.array;
  const size_t n = std::min<size_t>(a.size(), 64);
  for (size_t k = 0; k < n; ++k) {
    const corelm::io::GGUFValue e = a[k];
    if (e.type == T::String && e.s != a.string_at(k)) std::abort();
    if (depth < 4) touch(e, depth + 1);
  }
  try {
    if (a.type() == T::String) (void)a.strings();
    else if (a.type() != T::Array) (void)a.floats();
  } catch (const corelm::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = corelm::fuzz::write_input(data, size, ".gguf");
  try {
    corelm::io::GGUFFile f = corelm::io::GGUFFile::open(path);
    for (const auto& [key, value] : f.metadata()) touch(value, 0);
    for (const auto& info : f.tensors()) {
      corelm::Tensor t = f.get(info.name);
      int64_t n = 1;
      for (int64_t d : info.ne) n *= d;
      if (t.numel() != n) std::abort();  // a view or dequantised copy of exactly the declared size
    }
    corelm::model::load_gguf_model(path);
  } catch (const corelm::Error&) {
  }
  return 0;
}
