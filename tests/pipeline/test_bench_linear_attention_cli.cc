// `corelm bench linear-attention` as a user runs it (the real binary): one JSON object with the
// shape it was asked for and positive figures, and a bad flag value as an error. Speed itself is
// never asserted here.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cli_runner.h"

namespace corelm::testing {
namespace {

int run_corelm(const std::vector<std::string>& args, std::string& out) {
  const std::string log =
      (std::filesystem::temp_directory_path() / ("corelm_bench_la_" + std::to_string(::getpid()) + ".log")).string();
  const int code = wait_exit(spawn_corelm(args, log));
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  std::filesystem::remove(log);
  return code;
}

TEST(BenchLinearAttentionCli, PrintsTheFiguresAsJson) {
  if (!std::filesystem::exists(corelm_path())) GTEST_SKIP() << corelm_path() << " is not built (target corelm_cli)";
  std::string out;
  ASSERT_EQ(run_corelm({"bench", "linear-attention", "--seq-len", "100", "--q-heads", "4", "--kv-heads", "2",
                        "--state-dim", "8", "--value-dim", "4", "--seconds", "0.01", "--json"},
                       out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("seq_len"), 100);
  EXPECT_EQ(j.at("q_heads"), 4);
  EXPECT_EQ(j.at("kv_heads"), 2);
  EXPECT_EQ(j.at("threads"), 1);
  for (const char* figure : {"chunked_forward_ms", "chunked_forward_backward_ms", "reference_forward_ms",
                             "reference_forward_backward_ms", "decode_step_us", "decode_tokens_per_s"})
    EXPECT_GT(j.at(figure).get<double>(), 0.0) << figure;
  // Hq not a multiple of Hkv: the op's ShapeError, reported as an error exit.
  EXPECT_NE(run_corelm({"bench", "linear-attention", "--q-heads", "3", "--kv-heads", "2", "--seconds", "0.01"}, out),
            0);
  EXPECT_NE(out.find("multiple of kv heads"), std::string::npos) << out;
}

}  // namespace
}  // namespace corelm::testing
