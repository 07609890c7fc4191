// Runs tests/tokenizer/oracle_tokenize.py in the test venv on a list of strings.
#pragma once
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace corelm::test {

inline std::filesystem::path fresh_temp_dir(const std::string& tag) {
  std::random_device rd;
  auto dir = std::filesystem::temp_directory_path() / ("corelm_tok_" + tag + "_" + std::to_string(rd()));
  std::filesystem::create_directories(dir);
  return dir;
}

// Returns one JSON object per text, or nullopt with *why set when the oracle cannot run.
inline std::optional<std::vector<nlohmann::json>> run_oracle(const std::string& kind, const std::string& args,
                                                             const std::vector<std::string>& texts, std::string* why) {
  std::string python = CORELM_TEST_PYTHON;
  if (!std::filesystem::exists(python)) {
    *why = "test venv python not found at " + python + " (run scripts/setup --test)";
    return std::nullopt;
  }
  auto dir = fresh_temp_dir("oracle");
  auto in = dir / "in.jsonl", out = dir / "out.jsonl";
  {
    std::ofstream f(in);
    for (const auto& t : texts) f << nlohmann::json(t).dump() << "\n";
  }
  std::string cmd = python + " " + std::string(CORELM_SOURCE_DIR) + "/tests/tokenizer/oracle_tokenize.py --kind " + kind +
                    " " + args + " --input " + in.string() + " --output " + out.string();
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::filesystem::remove_all(dir);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {  // a reference package is not installed: skip
      *why = "oracle package missing (run scripts/setup --test): " + cmd;
      return std::nullopt;
    }
    ADD_FAILURE() << "oracle failed (status " << rc << "): " << cmd;  // a real failure, not a skip
    *why = "oracle failed";
    return std::nullopt;
  }
  std::vector<nlohmann::json> result;
  std::ifstream f(out);
  std::string line;
  while (std::getline(f, line)) result.push_back(nlohmann::json::parse(line));
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace corelm::test
