// stories260K (a real llama2.c checkpoint) through our Decoder: reference logits from run.c,
// greedy generation byte for byte, and the TinyStories NLL figure. The data lives outside the
// repository (../shared/data); without it the tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "corelm/architecture.h"
#include "corelm/autograd.h"
#include "corelm/gguf.h"
#include "corelm/llama2c.h"
#include "corelm/model.h"

namespace corelm {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data";
const fs::path kModelDir = kData / "models" / "stories260K";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Stories260K : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kModelDir / "stories260K.bin") || !fs::exists(kModelDir / "tok512.bin"))
      GTEST_SKIP() << "stories260K not found under " << kModelDir.string() << " (shared data set absent)";
    auto ck = model::load_llama2c_model((kModelDir / "stories260K.bin").string());
    decoder_ = std::make_unique<model::Decoder>(model::ModelConfig::from_json(ck.config, "stories260K.bin"));
    for (auto& [name, t] : ck.tensors) decoder_->load_parameter(name, t);
    tok_ = std::make_unique<io::Llama2cTokenizer>(
        io::Llama2cTokenizer::load((kModelDir / "tok512.bin").string(), ck.config.at("vocab_size").get<int64_t>()));
  }
  static int64_t argmax(const float* p, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
      if (p[i] > p[best]) best = i;  // first index on ties, as run.c
    return best;
  }
  std::unique_ptr<model::Decoder> decoder_;
  std::unique_ptr<io::Llama2cTokenizer> tok_;
};

TEST_F(Stories260K, LogitsMatchRunC) {
  const auto ref = nlohmann::json::parse(slurp(kModelDir / "reference_logits_greedy32.json"));
  const auto input = ref.at("input_tokens").get<std::vector<int64_t>>();
  const auto expected = ref.at("logits").get<std::vector<std::vector<float>>>();
  const int64_t T = static_cast<int64_t>(input.size()), V = 512;
  autograd::NoGradGuard no_grad;
  Tensor logits = decoder_->forward(Tensor::from_vector(input, {1, T})).contiguous();
  const float* p = logits.data<float>();
  double max_abs = 0, max_rel = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      const double e = expected[t][v], a = p[t * V + v], d = std::abs(a - e);
      max_abs = std::max(max_abs, d);
      max_rel = std::max(max_rel, d / std::max(1.0, std::abs(e)));
      ASSERT_LE(d, 1e-4 * std::max(1.0, std::abs(e))) << "pos " << t << " token " << v;
    }
  const auto greedy = ref.at("greedy_next_tokens").get<std::vector<int64_t>>();
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(argmax(p + t * V, V), greedy[t]) << "pos " << t;
  std::cout << "stories260K logits vs run.c: max abs err " << max_abs << ", max rel err " << max_rel << "\n";
}

// The same model through GGUF (llama.cpp names, interleaved q/k rows): F32 gives the very same
// logits; Q8_0 (only the rows of 32: embeddings, q/k/v/o, gate/up; down_proj falls back to F16)
// stays close.
TEST_F(Stories260K, GgufRoundTripKeepsTheLogits) {
  auto ck = model::load_llama2c_model((kModelDir / "stories260K.bin").string());
  const auto ref = nlohmann::json::parse(slurp(kModelDir / "reference_logits_greedy32.json"));
  const auto input = ref.at("input_tokens").get<std::vector<int64_t>>();
  const fs::path tmp = fs::temp_directory_path() / ("corelm_s260k_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  autograd::NoGradGuard no_grad;
  Tensor direct = decoder_->forward(Tensor::from_vector(input, {1, 32})).contiguous();
  for (auto type : {io::GGMLType::F32, io::GGMLType::Q8_0}) {
    const std::string path = (tmp / "m.gguf").string();
    model::save_gguf_model(path, ck.config, ck.tensors, type, tok_->gguf_metadata());
    auto g = model::load_gguf_model(path);
    EXPECT_EQ(io::GGUFFile::open(path).at("tokenizer.ggml.tokens").array.size(), 512u);
    EXPECT_EQ(g.config.at("bos_token_id"), 1);
    model::Decoder d(model::ModelConfig::from_json(g.config, path));
    for (auto& [name, t] : g.tensors) d.load_parameter(name, t);
    Tensor logits = d.forward(Tensor::from_vector(input, {1, 32})).contiguous();
    double max_abs = 0;
    for (int64_t i = 0; i < logits.numel(); ++i)
      max_abs = std::max(max_abs, double(std::abs(logits.data<float>()[i] - direct.data<float>()[i])));
    std::cout << "stories260K via GGUF " << io::ggml_type_name(type) << ": max |logit - direct| " << max_abs << "\n";
    if (type == io::GGMLType::F32) EXPECT_LE(max_abs, 1e-5);
    else EXPECT_LE(max_abs, 0.5);
  }
  fs::remove_all(tmp);
}

TEST_F(Stories260K, GreedyTextMatchesRunCByteForByte) {
  // run.c -t 0 -n 200: BOS at pos 0, then argmax; stop when BOS comes back; print pieces.
  const std::string expected = slurp(kModelDir / "expected_greedy_n200.txt");
  model::KVCache cache(decoder_->config(), 1, 512);
  std::string out;
  int64_t token = io::Llama2cTokenizer::kBos;
  for (int64_t pos = 0; pos < 200; ++pos) {
    Tensor logits = decoder_->forward_cached(Tensor::from_vector(std::vector<int64_t>{token}, {1, 1}), cache, {0})
                        .contiguous();
    const int64_t next = argmax(logits.data<float>(), logits.size(-1));
    if (next == io::Llama2cTokenizer::kBos) break;
    out += io::Llama2cTokenizer::printable(tok_->decode(token, next));
    token = next;
  }
  out += "\n";
  EXPECT_EQ(out, expected);
}

// run.c's sampler, step for step: xorshift64* coin, logits / T, float softmax, top-p over the
// probabilities >= (1 - p) / (V - 1) sorted descending, then the inverse CDF of the kept mass.
struct RunCSampler {
  uint64_t state;
  float temperature, topp;
  float coin() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    const auto u = static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
    return static_cast<float>(u >> 8) / 16777216.0f;
  }
  int64_t sample(std::vector<float> x) {
    const int64_t n = static_cast<int64_t>(x.size());
    for (auto& v : x) v /= temperature;
    float mx = x[0], sum = 0;
    for (float v : x) mx = std::max(mx, v);
    for (auto& v : x) sum += (v = std::exp(v - mx));
    for (auto& v : x) v /= sum;
    const float c = coin(), cutoff = (1.0f - topp) / static_cast<float>(n - 1);
    std::vector<std::pair<float, int64_t>> kept;
    for (int64_t i = 0; i < n; ++i)
      if (x[i] >= cutoff) kept.emplace_back(x[i], i);
    std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    float cum = 0;
    size_t last = kept.size() - 1;
    for (size_t i = 0; i < kept.size(); ++i) {
      cum += kept[i].first;
      if (cum > topp) {
        last = i;
        break;
      }
    }
    const float r = c * cum;
    float cdf = 0;
    for (size_t i = 0; i <= last; ++i) {
      cdf += kept[i].first;
      if (r < cdf) return kept[i].second;
    }
    return kept[last].second;
  }
};

TEST_F(Stories260K, SampledTextMatchesRunC) {
  // run.c -t 1.0 -p 0.9 -s 133742 (-n 256 as in doc/stories260K.md).
  const std::string expected = slurp(kModelDir / "expected_t1.0_p0.9_s133742.txt");
  RunCSampler sampler{133742, 1.0f, 0.9f};
  model::KVCache cache(decoder_->config(), 1, 512);
  std::string out;
  int64_t token = io::Llama2cTokenizer::kBos;
  for (int64_t pos = 0; pos < 256; ++pos) {
    Tensor logits = decoder_->forward_cached(Tensor::from_vector(std::vector<int64_t>{token}, {1, 1}), cache, {0})
                        .contiguous();
    const int64_t next =
        sampler.sample(std::vector<float>(logits.data<float>(), logits.data<float>() + logits.size(-1)));
    if (next == io::Llama2cTokenizer::kBos) break;
    out += io::Llama2cTokenizer::printable(tok_->decode(token, next));
    token = next;
  }
  out += "\n";
  EXPECT_EQ(out, expected);
}

TEST_F(Stories260K, EncoderMatchesReferenceTokenCounts) {
  const auto ref = nlohmann::json::parse(slurp(kModelDir / "reference_nll_tinystories_200para.json"));
  std::ifstream text(kData / "corpus" / "tinystories_valid_head.txt");
  ASSERT_TRUE(text.good());
  std::string line;
  int64_t i = 0;
  const auto& paras = ref.at("per_paragraph");
  while (i < static_cast<int64_t>(paras.size()) && std::getline(text, line)) {
    if (line.empty()) continue;
    EXPECT_EQ(static_cast<int64_t>(tok_->encode(line, true, false).size()),
              paras[i].at("n_tokens_incl_bos").get<int64_t>())
        << "paragraph " << i;
    ++i;
  }
  EXPECT_EQ(i, 200);
}

TEST_F(Stories260K, TinyStoriesNllMatchesRunC) {
  const auto ref = nlohmann::json::parse(slurp(kModelDir / "reference_nll_tinystories_200para.json"));
  std::ifstream text(kData / "corpus" / "tinystories_valid_head.txt");
  ASSERT_TRUE(text.good());
  autograd::NoGradGuard no_grad;
  std::string line;
  double total = 0;
  int64_t predicted = 0, paragraphs = 0;
  while (paragraphs < 200 && std::getline(text, line)) {
    if (line.empty()) continue;
    const auto ids = tok_->encode(line, true, false);
    const int64_t T = static_cast<int64_t>(ids.size()) - 1;
    Tensor logits = decoder_->forward(Tensor::from_vector(std::vector<int64_t>(ids.begin(), ids.end() - 1), {1, T}))
                        .contiguous();
    const float* p = logits.data<float>();
    const int64_t V = logits.size(-1);
    double sum = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = p + t * V;
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
      sum += -(static_cast<double>(row[ids[t + 1]]) - mx - std::log(z));
    }
    EXPECT_NEAR(sum, ref.at("per_paragraph")[paragraphs].at("sum_nll_nats").get<double>(), 5e-3)
        << "paragraph " << paragraphs;
    total += sum;
    predicted += T;
    ++paragraphs;
  }
  EXPECT_EQ(predicted, ref.at("predicted_tokens").get<int64_t>());
  const double mean = total / static_cast<double>(predicted);
  std::cout << std::setprecision(8) << "stories260K TinyStories NLL: " << mean << " nats/token (run.c "
            << ref.at("mean_nll_nats_per_token").get<double>() << "), total " << total << " (run.c "
            << ref.at("total_nll_nats").get<double>() << ")\n";
  EXPECT_NEAR(mean, ref.at("mean_nll_nats_per_token").get<double>(), 5e-5);  // equal to 4 decimals
}

}  // namespace
}  // namespace corelm
