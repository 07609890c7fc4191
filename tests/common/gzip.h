// gzip-compressed fixtures for the tests of compressed inputs (corpus builds, data faults): the
// whole input in one deflate call, so a test's fixture is its plain text plus this.
#pragma once
#include <zlib.h>

#include <string>

namespace corelm::testing {

// data as one gzip member (deflate level 6, gzip header from windowBits 16 + MAX_WBITS).
inline std::string gzip(const std::string& data) {
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

}  // namespace corelm::testing
