#include "tokenizer/file_io.h"

#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "corelm/error.h"

namespace corelm::tok {

bool file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

std::string zstd_decompress(const std::string& data, const std::string& source) {
  ZSTD_DStream* stream = ZSTD_createDStream();
  CORELM_CHECK(stream != nullptr, Error, "zstd: out of memory");
  std::string out;
  std::string buffer(ZSTD_DStreamOutSize(), '\0');
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  size_t ret = 1;
  while (in.pos < in.size) {
    ZSTD_outBuffer ob{buffer.data(), buffer.size(), 0};
    ret = ZSTD_decompressStream(stream, &ob, &in);
    if (ZSTD_isError(ret)) {
      std::string msg = ZSTD_getErrorName(ret);
      ZSTD_freeDStream(stream);
      throw FormatError(source + ": corrupt zstd data: " + msg);
    }
    out.append(buffer.data(), ob.pos);
  }
  ZSTD_freeDStream(stream);
  CORELM_CHECK(ret == 0, FormatError, source, ": truncated zstd data");
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  CORELM_CHECK(!in.bad(), IOError, path, ": read failed");
  std::string data = std::move(ss).str();
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".zst") == 0) return zstd_decompress(data, path);
  return data;
}

}  // namespace corelm::tok
