// Helpers shared by the tokenizer tests: locating ../shared/data, reading fixtures, running the
// Python oracle.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace corelm::test {

inline std::string shared_data() { return std::string(CORELM_SOURCE_DIR) + "/../shared/data"; }
inline std::string tokenizers_dir() { return shared_data() + "/tokenizers"; }

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string without_cr(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s)
    if (c != '\r') out.push_back(c);
  return out;
}

#define CORELM_REQUIRE_FILE(path)                                                                    \
  do {                                                                                              \
    if (!std::filesystem::exists(path))                                                             \
      GTEST_SKIP() << "shared data not found: " << (path)                                           \
                   << " (tests that use ../shared/data skip when it is absent)";                    \
  } while (0)

}  // namespace corelm::test
