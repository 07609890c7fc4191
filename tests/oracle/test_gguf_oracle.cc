// GGUF against the reference `gguf` Python package (tests/oracle/gguf_oracle.py): a file the
// package writes loads in ours with the same metadata and (dequantised) tensors, our Q8_0/Q4_0
// quantisation gives the package's values, and a file we write reads back in the package.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
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

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the oracle script; returns its JSON, or nullopt after GTEST_SKIP/ADD_FAILURE.
std::optional<json> run_oracle(const std::string& mode, const fs::path& file, bool& skipped) {
  const char* env_python = std::getenv("CORELM_TEST_PYTHON");
  const std::string python = env_python && *env_python ? env_python : CORELM_TEST_PYTHON;
  skipped = access(python.c_str(), X_OK) != 0;
  if (skipped) return std::nullopt;
  const fs::path out = file.string() + "." + mode + ".json", log = file.string() + "." + mode + ".log";
  const std::string cmd = "'" + python + "' -B '" + CORELM_SOURCE_DIR + "/tests/oracle/gguf_oracle.py' " + mode +
                          " '" + file.string() + "' > '" + out.string() + "' 2> '" + log.string() + "'";
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  skipped = code == kNoPythonPackages;
  if (skipped) return std::nullopt;
  EXPECT_EQ(code, 0) << cmd << "\n" << read_text(log);
  if (code != 0) return std::nullopt;
  return json::parse(read_text(out));
}

class GGUFOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_gguf_oracle_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

void expect_value_matches(const std::string& key, const GGUFValue& ours, const json& ref) {
  const auto type = ref.at("type").get<std::string>();
  auto scalar = [&](const GGUFValue& v, const json& r) {
    if (v.type == GGUFType::String) EXPECT_EQ(v.as_string(), r.get<std::string>()) << key;
    else if (v.type == GGUFType::Float32 || v.type == GGUFType::Float64) EXPECT_EQ(v.as_float(), r.get<double>()) << key;
    else if (v.type == GGUFType::Bool) EXPECT_EQ(v.i != 0, r.get<bool>()) << key;
    else if (v.type == GGUFType::Uint64) EXPECT_EQ(v.u, r.get<uint64_t>()) << key;
    else EXPECT_EQ(v.as_int(), r.get<int64_t>()) << key;
  };
  std::string name = gguf_type_name(ours.type);
  for (auto& ch : name) ch = static_cast<char>(std::toupper(ch));
  EXPECT_EQ(name, type) << key;
  if (ours.type == GGUFType::Array) {
    const auto& vals = ref.at("value");
    ASSERT_EQ(ours.array.size(), vals.size()) << key;
    for (size_t i = 0; i < vals.size(); ++i) scalar(ours.array[i], vals[i]);
  } else {
    scalar(ours, ref.at("value"));
  }
}

TEST_F(GGUFOracle, PackageFileLoadsInOursAndOursInPackage) {
  // 1. Theirs -> ours.
  const fs::path theirs = dir_ / "theirs.gguf";
  bool skipped = false;
  auto ref = run_oracle("write", theirs, skipped);
  if (skipped) GTEST_SKIP() << "gguf oracle unavailable (pip gguf==0.10.0 in the venv: scripts/setup --test)";
  ASSERT_TRUE(ref.has_value());
  auto f = GGUFFile::open(theirs.string());
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), ref->at("metadata").size());
  for (const auto& [key, v] : f.metadata()) expect_value_matches(key, v, ref->at("metadata").at(key));
  ASSERT_EQ(f.tensors().size(), ref->at("tensors").size());
  for (const auto& [name, rt] : ref->at("tensors").items()) {
    Tensor t = f.get(name);
    EXPECT_EQ(ggml_type_name(f.info(name).type), rt.at("type").get<std::string>()) << name;
    EXPECT_EQ(t.shape(), rt.at("shape").get<Shape>()) << name;
    EXPECT_EQ(t.to_float_vector(), rt.at("values").get<std::vector<float>>()) << name;
  }
  // Our quantisers on the same input reproduce the package's blocks (compared dequantised).
  Tensor orig = f.get("orig");
  const fs::path requant = dir_ / "requant.gguf";
  save_gguf(requant.string(), {}, {{"q8", orig, GGMLType::Q8_0}, {"q4", orig, GGMLType::Q4_0},
                                   {"bf16", orig, GGMLType::BF16}, {"f16", orig, GGMLType::F16}});
  auto rq = GGUFFile::open(requant.string());
  for (const char* name : {"q8", "q4", "bf16", "f16"})
    EXPECT_EQ(rq.get(name).to_float_vector(), f.get(name).to_float_vector()) << name;

  // 2. Ours -> theirs.
  const fs::path ours = dir_ / "ours.gguf";
  std::vector<std::pair<std::string, GGUFValue>> kv;
  for (const auto& e : f.metadata()) kv.push_back(e);
  kv.emplace_back("general.alignment", GGUFValue::of(GGUFType::Uint32, 64));
  Generator gen(11);
  std::vector<GGUFWriteTensor> ts = {{"a.f32", Tensor::randn({3, 5}, gen), GGMLType::F32},
                                     {"a.f16", Tensor::randn({2, 64}, gen), GGMLType::F16},
                                     {"a.bf16", Tensor::randn({4, 32}, gen), GGMLType::BF16},
                                     {"a.q8", Tensor::randn({2, 2, 64}, gen), GGMLType::Q8_0},
                                     {"a.q4", Tensor::randn({32}, gen), GGMLType::Q4_0}};
  save_gguf(ours.string(), kv, ts);
  auto back = run_oracle("read", ours, skipped);
  ASSERT_TRUE(back.has_value());
  auto mine = GGUFFile::open(ours.string());
  for (const auto& [key, v] : mine.metadata()) expect_value_matches(key, v, back->at("metadata").at(key));
  ASSERT_EQ(back->at("tensors").size(), ts.size());
  for (const auto& t : ts) {
    const auto& rt = back->at("tensors").at(t.name);
    EXPECT_EQ(rt.at("type").get<std::string>(), ggml_type_name(t.type)) << t.name;
    EXPECT_EQ(rt.at("shape").get<Shape>(), t.value.shape()) << t.name;
    EXPECT_EQ(rt.at("values").get<std::vector<float>>(), mine.get(t.name).to(DType::F32).to_float_vector()) << t.name;
  }
}

}  // namespace
}  // namespace corelm::io
