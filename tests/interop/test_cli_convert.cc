// The `corelm convert` / `inspect` / `generate --model` command lines on real files (the binary
// built beside the tests; skipped when it was not built): llama2.c -> GGUF -> sharded HF folder,
// JSON summaries, greedy text equal across the three inputs, and clear one-line errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace corelm {
namespace {

namespace fs = std::filesystem;

const fs::path kBinary = fs::path(CORELM_BINARY_DIR) / "corelm";
const fs::path kStories = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data" / "models" / "stories260K";

struct CmdResult {
  int status;
  std::string out;
};

// stdout only when `json` (progress and statistics go to stderr), else both.
CmdResult run(const std::string& args, bool json = false) {
  const std::string cmd = kBinary.string() + " " + args + (json ? " 2>/dev/null" : " 2>&1");
  CmdResult r{0, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = ::pclose(p);
  return r;
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

class CliConvert : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kBinary)) GTEST_SKIP() << kBinary.string() << " not built (cmake --build --target corelm_cli)";
    if (!fs::exists(kStories / "stories260K.bin")) GTEST_SKIP() << "stories260K absent under " << kStories.string();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_ = fs::temp_directory_path() / ("corelm_cli_" + std::to_string(::getpid()));
};

TEST_F(CliConvert, Llama2cToGgufToShardedFolderGeneratesTheSameText) {
  const std::string bin = (kStories / "stories260K.bin").string(), tok = (kStories / "tok512.bin").string();
  const std::string gguf = (dir_ / "s.gguf").string(), hf = (dir_ / "hf").string();
  CmdResult r = run("convert " + bin + " " + gguf + " --tokenizer " + tok + " --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(last_line(r.out));
  EXPECT_EQ(j["to"], "gguf");
  EXPECT_EQ(j["input_format"], "llama2c");
  EXPECT_EQ(j["tensors"], 47);
  EXPECT_EQ(j["tokenizer"], true);

  r = run("convert " + bin + " " + hf + " --to hf --tokenizer " + tok + " --shard-size 200000 --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "model.safetensors.index.json"));

  r = run("inspect " + hf + " --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["num_parameters"], 260032);
  EXPECT_EQ(j["config"]["num_hidden_layers"], 5);
  r = run("inspect " + gguf + " --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["num_parameters"], 260032);

  std::string first;
  for (const std::string& model : {bin + " --tokenizer " + tok, gguf, hf}) {
    r = run("generate --model " + model + " --prompt 'Once upon a time' --greedy -n 40 --json", true);
    ASSERT_EQ(r.status, 0) << r.out;
    const std::string text = nlohmann::json::parse(last_line(r.out))["text"];
    if (first.empty()) first = text;
    EXPECT_EQ(text, first) << model;
  }
  EXPECT_NE(first.find("Lily"), std::string::npos) << first;
}

// A quantised GGUF (issue 18): convert writes it, inspect counts tensors per ggml type, generate
// runs it. stories260K's rows of 64 take Q4_1; w2's rows of 172 are not whole blocks (F16).
TEST_F(CliConvert, QuantisedGgufInspectsAndGenerates) {
  const std::string bin = (kStories / "stories260K.bin").string(), tok = (kStories / "tok512.bin").string();
  const std::string gguf = (dir_ / "q.gguf").string();
  CmdResult r = run("convert " + bin + " " + gguf + " --tokenizer " + tok + " --dtype q4_1 --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("inspect " + gguf + " --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["ggml_types"].value("Q4_1", 0), 0) << j["ggml_types"].dump();
  EXPECT_GT(j["ggml_types"].value("F32", 0), 0) << j["ggml_types"].dump();
  int64_t counted = 0;
  for (const auto& [type, n] : j["ggml_types"].items()) counted += n.get<int64_t>();
  EXPECT_EQ(counted, static_cast<int64_t>(j["tensors"].size()));
  r = run("inspect " + gguf, true);
  EXPECT_NE(r.out.find("Q4_1 x "), std::string::npos) << r.out;
  r = run("generate --model " + gguf + " --prompt 'Once upon a time' --greedy -n 20 --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(nlohmann::json::parse(last_line(r.out))["text"].get<std::string>().empty());
  r = run("convert " + bin + " " + (dir_ / "k.gguf").string() + " --tokenizer " + tok + " --dtype q2_k");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("supported: f32, bf16, f16, q8_0, q4_0, q4_1"), std::string::npos) << r.out;
}

TEST_F(CliConvert, ErrorsAreOneClearLine) {
  const std::string bin = (kStories / "stories260K.bin").string();
  CmdResult r = run("convert " + bin + " " + (dir_ / "x").string() + " --dtype q8_0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--dtype q8_0 is a GGUF type"), std::string::npos) << r.out;
  r = run("generate --model " + bin + " --prompt hi");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("needs --tokenizer"), std::string::npos) << r.out;
  r = run("convert " + (dir_ / "missing").string() + " " + (dir_ / "y.gguf").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("cannot open"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace corelm
