// A fresh temporary state dir per test (dir_) and the queue file inside it (path_), removed
// afterwards: the fixture of tests/queue/test_queue.cc and tests/queue/test_batches.cc.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "corelm/queue.h"

namespace corelm::queue {

class QueueDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "corelm_queue_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = queue_path(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_, path_;
};

// The content hash the queue stores for a /v1/completions row (FNV-1a 64 of model, a 0 byte, body),
// computed independently of the library: tests of old schema files write rows with it.
inline std::string fnv1a_model_body(const std::string& model, const std::string& body) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : model) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h *= 1099511628211ull;
  for (unsigned char c : body) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return std::string(out);
}

}  // namespace corelm::queue
