// Interop of our safetensors files and config.json with the PyPI `safetensors` and
// `transformers` packages (see tests/oracle/safetensors_roundtrip.py): a file written by us loads
// there with the right values and metadata, a file written by the package loads here, and a
// Decoder saved as config.json + model.safetensors loads in transformers and gives our logits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "corelm/model.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "corelm/safetensors.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

namespace fs = std::filesystem;

// Must match VALUES in safetensors_roundtrip.py.
const std::vector<float> kValues = {0.0f, 1.0f, -2.0f, 3.5f, 100.0f, -7.0f, 0.25f, 12.0f};
constexpr int kNoPythonPackages = 77;

Tensor pattern(DType dt, const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = kValues[i % kValues.size()];
    if (dt == DType::U8) v[i] = std::fabs(v[i]);
  }
  return Tensor::from_vector(v, shape).to(dt);
}

model::ModelConfig model_config(bool qwen) {
  model::ModelConfig c;
  c.model_type = qwen ? "qwen2" : "llama";
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = qwen ? 2 : 1;
  c.head_dim = 12;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = !qwen;
  c.attention_bias = qwen;
  c.rope_theta = qwen ? 1e6 : 1e4;
  c.initializer_range = 0.1;
  return c;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SafetensorsOracle, InteropWithPyPIPackages) {
  const fs::path dir = fs::path(CORELM_BINARY_DIR) / "oracle" / ("safetensors_interop_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct RemoveOnExit {
    fs::path p;
    ~RemoveOnExit() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};

  // Our writer: one tensor per dtype, some shapes awkward (scalar, empty, odd sizes).
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::vector<std::pair<DType, Shape>> specs = {
      {DType::F32, {3, 5}}, {DType::BF16, {7}},   {DType::F16, {2, 2, 3}}, {DType::I32, {5}},
      {DType::I64, {2, 3}}, {DType::I8, {9}},     {DType::U8, {3, 1}},     {DType::F32, {}},
      {DType::F16, {0, 4}}};
  const char* st_names[] = {"F32", "BF16", "F16", "I32", "I64", "I8", "U8"};
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [dt, shape] = specs[i];
    tensors.emplace_back(std::string(st_names[static_cast<int>(dt)]) + "_" + std::to_string(i), pattern(dt, shape));
  }
  io::save_safetensors((dir / "ours.safetensors").string(), tensors, {{"writer", "corelm"}, {"note", "ünïcode"}});

  // Models: a tied Llama with MQA and an untied Qwen2 with biases; norms and biases random.
  std::map<std::string, model::Decoder> models;
  for (bool qwen : {false, true}) {
    model::Decoder m(model_config(qwen));
    m.init_weights(qwen ? 2 : 1);
    Generator g(9);
    for (const auto& [n, t] : m.named_parameters())
      if (n.find("norm") != std::string::npos || n.find("bias") != std::string::npos)
        m.load_parameter(n, ops::add_scalar(Tensor::randn(t.shape(), g, 0.2f), n.find("norm") != std::string::npos));
    const fs::path folder = dir / (qwen ? "model_qwen2" : "model_llama");
    fs::create_directories(folder);
    m.config().save((folder / "config.json").string());
    io::save_safetensors((folder / "model.safetensors").string(), m.named_parameters(), {{"format", "pt"}});
    std::ofstream(folder / "ids.json") << "[[5, 17, 96, 0, 33, 33, 8, 71, 2, 40, 41], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]";
    models.emplace(qwen ? "qwen2" : "llama", std::move(m));
  }

  const fs::path log = dir / "python.log";
  // Same override as the other oracle tests: CORELM_TEST_PYTHON in the environment wins.
  const char* env_python = std::getenv("CORELM_TEST_PYTHON");
  const std::string python = env_python && *env_python ? env_python : CORELM_TEST_PYTHON;
  if (access(python.c_str(), X_OK) != 0) GTEST_SKIP() << "no oracle python at " << python;
  const std::string cmd = "'" + python + "' -B '" + CORELM_SOURCE_DIR +
                          "/tests/oracle/safetensors_roundtrip.py' '" + dir.string() + "' > '" + log.string() +
                          "' 2>&1";
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == kNoPythonPackages) GTEST_SKIP() << "safetensors/transformers not importable: " << read_text(log);
  ASSERT_EQ(code, 0) << cmd << "\n" << read_text(log);

  // The package's writer, read by ours: same tensors, bit for bit, and the metadata.
  auto theirs = io::SafetensorsFile::open((dir / "theirs.safetensors").string());
  EXPECT_EQ(theirs.metadata().at("writer"), "safetensors");
  EXPECT_EQ(theirs.metadata().at("note"), "ünïcode");
  ASSERT_EQ(theirs.names().size(), tensors.size());
  for (const auto& [name, ref] : tensors) {
    Tensor t = theirs.get(name);
    EXPECT_EQ(t.dtype(), ref.dtype()) << name;
    EXPECT_EQ(t.shape(), ref.shape()) << name;
    ASSERT_EQ(t.nbytes(), ref.nbytes()) << name;
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(t.contiguous().raw_data(), ref.raw_data(), t.nbytes()), 0) << name;
    }
  }

  // transformers loaded our config.json + weights: its logits equal ours.
  for (auto& [name, m] : models) {
    const fs::path folder = dir / ("model_" + name);
    auto hf = io::SafetensorsFile::open((folder / "hf_logits.safetensors").string());
    EXPECT_TRUE(hf.contains(name == "qwen2" ? "architecture_is_Qwen2ForCausalLM" : "architecture_is_LlamaForCausalLM"));
    std::vector<int64_t> ids;
    for (const auto& row : json::parse(read_text(folder / "ids.json")))
      for (const auto& v : row) ids.push_back(v.get<int64_t>());
    Tensor logits = m.forward(Tensor::from_vector(ids, {2, static_cast<int64_t>(ids.size()) / 2}));
    ErrorStats e = ErrorStats::between(logits.to_float_vector(), hf.get("logits").to_float_vector());
    std::printf("ORACLE safetensors interop model=%s (our config.json + weights in transformers) logits max_abs=%s "
                "max_rel=%s\n",
                name.c_str(), format_error(e.max_abs).c_str(), format_error(e.max_rel).c_str());
    EXPECT_LE(e.max_rel, 3e-5) << name;
  }
}

}  // namespace
}  // namespace corelm::oracle
