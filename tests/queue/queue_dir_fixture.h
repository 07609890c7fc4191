// A fresh temporary state dir per test (dir_) and the queue file inside it (path_), removed
// afterwards: the fixture of tests/queue/test_queue.cc and tests/queue/test_batches.cc.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

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

}  // namespace corelm::queue
