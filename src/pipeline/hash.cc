#include "pipeline/hash.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "corelm/error.h"

namespace corelm::pipeline {
namespace {
uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

void Hasher::update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h_ = (h_ ^ (w * 0x9fb21c651e98df25ull)) * 0xc2b2ae3d27d4eb4full;
    h_ = (h_ << 29) | (h_ >> 35);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  h_ = mix(h_ ^ tail ^ (n << 3));
  n_ += n;
}

std::string Hasher::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(mix(h_ ^ n_)));
  return buf;
}

void hash_file(Hasher& h, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open for hashing");
  std::vector<char> buf(size_t(1) << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
}

}  // namespace corelm::pipeline
