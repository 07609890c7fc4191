// The benchmark subcommands as a user runs them (the real `corelm` binary): the JSON spellings the
// issue-5 acceptance checks read, figures that are positive, --only leaving the rest null, and a
// bad flag value as a clear error. Speed itself is never asserted here.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/model_factories.h"
#include "corelm/isa.h"
#include "pipeline_fixture.h"

namespace corelm::testing {
namespace {

class BenchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(corelm_path())) GTEST_SKIP() << corelm_path() << " is not built (build target corelm_cli)";
    dir_ = fs::temp_directory_path() / ("corelm_bench_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Runs corelm with args; returns its exit code and fills `out` with stdout + stderr.
  int run(const std::vector<std::string>& args, std::string& out) {
    const std::string log = (dir_ / "log.txt").string();
    const int code = wait_exit(spawn_corelm(args, log));
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    out = ss.str();
    return code;
  }
  fs::path dir_;
};

TEST_F(BenchCli, ModelOnlyMeasuresTheNamedFigures) {
  std::string out;
  ASSERT_EQ(run({"bench", "model", "--preset", "tiny", "--threads", "1", "--only", "decode_b1", "--seconds", "0.05",
                 "--json"},
                out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("isa"), isa_name(active_isa()));
  EXPECT_EQ(j.at("threads"), 1);
  EXPECT_GT(j.at("decode_b1_tok_s").get<double>(), 0.0);
  for (const char* skipped : {"scored_tok_s", "generated_tok_s", "train_tok_s", "train_sampled_tok_s"})
    EXPECT_TRUE(j.at(skipped).is_null()) << skipped;
  EXPECT_NE(run({"bench", "model", "--only", "everything"}, out), 0);
  EXPECT_NE(out.find("--only"), std::string::npos) << out;
}

// The llama-bench matrix: test names and fields as llama-bench spells them, one sample per
// repetition, the KV memory of each test computed from the config (f32 keys and values), the
// largest context a budget holds; the legacy grid is unchanged when no matrix flag is given.
TEST_F(BenchCli, ModelMatrixNamesTestsLikeLlamaBenchAndReportsKvMemory) {
  std::string out;
  ASSERT_EQ(run({"bench", "model", "--preset", "tiny", "--pp", "16,32", "--tg", "4", "--depth", "0,48",
                 "--repetitions", "2", "--kv-budget", "1000000", "--json"},
                out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  const auto& c = j.at("config");
  const int64_t per_token = 2 * c.at("num_hidden_layers").get<int64_t>() * c.at("num_key_value_heads").get<int64_t>() *
                            c.at("head_dim").get<int64_t>() * 4;
  EXPECT_EQ(j.at("type_k"), "f32");
  EXPECT_EQ(j.at("type_v"), "f32");
  EXPECT_TRUE(j.at("scored_tok_s").is_null());  // the matrix replaces the headline figures
  EXPECT_FALSE(j.contains("grid"));
  const auto& tests = j.at("tests");
  std::vector<std::string> names;
  for (const auto& t : tests) names.push_back(t.at("test"));
  EXPECT_EQ(names, (std::vector<std::string>{"pp16", "pp32", "tg4", "pp16 @ d48", "pp32 @ d48", "tg4 @ d48"}));
  for (const auto& t : tests) {
    const int64_t n = t.at("n_prompt").get<int64_t>() + t.at("n_gen").get<int64_t>();
    EXPECT_TRUE(t.at("n_prompt").get<int64_t>() == 0 || t.at("n_gen").get<int64_t>() == 0) << t;
    EXPECT_EQ(t.at("samples_ts").size(), 2u) << t;
    double mean = 0;
    for (const auto& v : t.at("samples_ts")) mean += v.get<double>() / 2;
    EXPECT_NEAR(t.at("avg_ts").get<double>(), mean, 1e-9 * mean) << t;
    EXPECT_GT(t.at("avg_ts").get<double>(), 0.0);
    EXPECT_GE(t.at("stddev_ts").get<double>(), 0.0);
    EXPECT_EQ(t.at("type_k"), "f32");
    EXPECT_EQ(t.at("kv_bytes").get<int64_t>(), per_token * (t.at("n_depth").get<int64_t>() + n)) << t;
  }
  ASSERT_EQ(j.at("kv_memory").size(), 2u);
  EXPECT_EQ(j.at("kv_memory")[1].at("n_depth"), 48);
  EXPECT_EQ(j.at("kv_memory")[1].at("bytes").get<int64_t>(), 48 * per_token);
  EXPECT_EQ(j.at("kv_budget").at("max_context").get<int64_t>(), 1000000 / per_token);
  EXPECT_DOUBLE_EQ(j.at("kv_budget").at("bytes_per_token").get<double>(), double(per_token));

  // Depths beyond the preset's context: the random model's context grows to the deepest test.
  ASSERT_EQ(run({"bench", "model", "--preset", "tiny", "--pp", "8", "--tg", "0", "--depth", "600", "--repetitions",
                 "1", "--json"},
                out),
            0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out).at("tests")[0].at("test"), "pp8 @ d600");

  // No matrix flag: the grid as before.
  ASSERT_EQ(run({"bench", "model", "--preset", "tiny", "--only", "decode_b1", "--seconds", "0.01", "--pp", "8", "--tg",
                 "2", "--batch", "1", "--json"},
                out),
            0)
      << out;
  const auto g = nlohmann::json::parse(out);
  EXPECT_FALSE(g.contains("tests"));
  ASSERT_EQ(g.at("grid").size(), 2u);
  EXPECT_EQ(g.at("grid")[0].at("test"), "pp8");
  EXPECT_EQ(g.at("grid")[1].at("test"), "tg2");

  EXPECT_NE(run({"bench", "model", "--preset", "tiny", "--pp", "8", "--tg", "0", "--cache-type-k", "fp9"}, out), 0);
  EXPECT_NE(out.find("fp9"), std::string::npos) << out;
}

// The matrix on the hybrid (issue 17): depths beyond the window run (the rings and recurrent states
// are restored from a copy for each repetition, since they cannot be rewound to a depth), and the
// cache's memory is the same at every depth -- the rings (window + 1 + chunk positions of keys and
// values) and the states (d_state x head_dim), computed here from the config -- so no budget limits
// the context (max_context -1).
TEST_F(BenchCli, ModelMatrixRunsTheHybridAtDepthsBeyondItsWindow) {
  std::string out;
  ASSERT_EQ(run({"bench", "model", "--preset", "hybrid", "--pp", "8", "--tg", "2", "--depth", "0,300",
                 "--repetitions", "1", "--kv-budget", "1000000", "--json"},
                out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  const auto& c = j.at("config");
  const int64_t D = c.at("head_dim"), Hkv = c.at("num_key_value_heads");
  const int64_t window = c.at("sliding_window"), d_state = c.at("linear_attention_state_size");
  ASSERT_GT(300, window);
  int64_t fixed = 0;
  for (const auto& kind : c.at("layer_types")) {
    if (kind == "sliding_attention") fixed += 2 * Hkv * (window + 1 + 64) * D * 4;  // KVCache::kRingChunk = 64
    if (kind == "linear_attention") fixed += Hkv * d_state * D * 4;
    EXPECT_NE(kind, "full_attention");
  }
  std::vector<std::string> names;
  for (const auto& t : j.at("tests")) {
    names.push_back(t.at("test"));
    EXPECT_GT(t.at("avg_ts").get<double>(), 0.0) << t;
    EXPECT_EQ(t.at("kv_bytes").get<int64_t>(), fixed) << t;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"pp8", "tg2", "pp8 @ d300", "tg2 @ d300"}));
  for (const auto& m : j.at("kv_memory")) EXPECT_EQ(m.at("bytes").get<int64_t>(), fixed) << m;
  EXPECT_EQ(j.at("kv_budget").at("max_context").get<int64_t>(), -1);
  EXPECT_EQ(j.at("kv_budget").at("bytes_per_token").get<int64_t>(), 0);
  EXPECT_EQ(j.at("kv_budget").at("fixed_bytes").get<int64_t>(), fixed);
}

// The matrix over a model file's own weights (issue 18: the same weights llama-bench reads): the
// file's config is measured, a depth beyond its context extends it (reported as trained_context),
// decode runs, and the training figures, which build a preset, are refused with --model.
TEST_F(BenchCli, ModelMatrixMeasuresAModelFile) {
  const model::ModelConfig c = small_decoder_config(false, 0.02);  // head_dim 32: one q8_0 block
  ASSERT_LT(c.max_position_embeddings, 100);
  model::Decoder d(c);
  d.init_weights(5);
  const std::string model_dir = (dir_ / "model").string();
  model::save_model_dir(model_dir, d);
  std::string out;
  ASSERT_EQ(run({"bench", "model", "--model", model_dir, "--pp", "8", "--tg", "2", "--depth", "0,100",
                 "--repetitions", "1", "--cache-type-k", "q8_0", "--cache-type-v", "f16", "--json"},
                out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("model"), model_dir);
  EXPECT_TRUE(j.at("preset").is_null());
  EXPECT_EQ(j.at("trained_context"), c.max_position_embeddings);
  EXPECT_EQ(j.at("config").at("hidden_size"), c.hidden_size);
  EXPECT_EQ(j.at("config").at("vocab_size"), c.vocab_size);
  EXPECT_EQ(j.at("config").at("max_position_embeddings"), 108);
  EXPECT_TRUE(j.at("train_tok_s").is_null());
  std::vector<std::string> names;
  for (const auto& t : j.at("tests")) {
    names.push_back(t.at("test"));
    EXPECT_GT(t.at("avg_ts").get<double>(), 0.0) << t;
    EXPECT_EQ(t.at("type_k"), "q8_0");
    EXPECT_EQ(t.at("type_v"), "f16");
  }
  EXPECT_EQ(names, (std::vector<std::string>{"pp8", "tg2", "pp8 @ d100", "tg2 @ d100"}));

  // Within the file's context nothing is extended.
  ASSERT_EQ(run({"bench", "model", "--model", model_dir, "--pp", "8", "--tg", "0", "-r", "1", "--json"}, out), 0)
      << out;
  EXPECT_TRUE(nlohmann::json::parse(out).at("trained_context").is_null());

  EXPECT_NE(run({"bench", "model", "--model", model_dir, "--only", "train"}, out), 0);
  EXPECT_NE(out.find("--model"), std::string::npos) << out;
  EXPECT_NE(run({"bench", "model", "--model", (dir_ / "missing").string(), "--pp", "8", "-r", "1"}, out), 0);
  EXPECT_NE(out.find("missing"), std::string::npos) << out;
}

TEST_F(BenchCli, GemmReportsEveryKernelAndPeak) {
  std::string out;
  ASSERT_EQ(run({"bench", "gemm", "--shapes", "8,64,96", "--seconds", "0.02", "--json"}, out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  for (const char* key : {"peak_fp32_gflops", "peak_bf16_gflops", "peak_int8_gops", "peak_amx_bf16_gflops",
                          "peak_amx_int8_gops"})
    EXPECT_TRUE(j.at(key).is_number()) << key;
  ASSERT_EQ(j.at("results").size(), 1u);
  const auto& r = j["results"][0];
  EXPECT_EQ(r.at("M"), 8);
  EXPECT_EQ(r.at("K"), 64);
  EXPECT_EQ(r.at("N"), 96);
  for (const char* key : {"gemm_f32_gflops", "linear_bf16_gflops", "linear_int8_gops"})
    EXPECT_GT(r.at(key).get<double>(), 0.0) << key;
  EXPECT_NE(run({"bench", "gemm", "--shapes", "8,64"}, out), 0);
  EXPECT_NE(out.find("8,64"), std::string::npos) << out;
}

TEST_F(BenchCli, MemoryReportsBandwidthPerWorkingSet) {
  std::string out;
  ASSERT_EQ(run({"bench", "memory", "--max-mib", "1", "--seconds", "0.01", "--json"}, out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("bench"), "memory");
  const auto& points = j.at("points");
  ASSERT_GE(points.size(), 2u) << out;
  EXPECT_EQ(points.back().at("bytes").get<int64_t>(), int64_t{1} << 20);  // up to --max-mib
  for (const auto& p : points) {
    EXPECT_GT(p.at("read_gb_s").get<double>(), 0.0);
    EXPECT_GT(p.at("copy_gb_s").get<double>(), 0.0);
  }
  EXPECT_NE(run({"bench", "memory", "--max-mib", "0"}, out), 0);
}

}  // namespace
}  // namespace corelm::testing
