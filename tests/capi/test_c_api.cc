// The C ABI (libcorelm.so) through its C header: every result is compared with the C++ library
// computing the same thing in this process (tokenizer, TextGenerator, a plain forward for scores),
// and every bad argument must come back as a status plus a message naming it, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/generate_fixtures.h"
#include "common/model_factories.h"
#include "corelm/c_api.h"
#include "corelm/generate.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/model_loader.h"
#include "corelm/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace corelm;

namespace {

std::string lib_path() { return std::string(CORELM_BINARY_DIR) + "/libcorelm.so"; }

class CApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("corelm_capi_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    const std::string text = corelm::testing::pseudo_text(
        {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home", "red", "blue", "yes", "no"},
        0xCA91ull, 3000, 9);
    auto tok = corelm::testing::train_small_bpe(*dir_, text, 300);
    fs::remove(*dir_ / "corpus.txt");
    model::ModelConfig c = corelm::testing::tiny_decoder_config(static_cast<int64_t>(tok->vocab_size()), 0.1);
    c.max_position_embeddings = 64;
    model::Decoder d(c);
    d.init_weights(77);
    model::save_model_dir(dir_->string(), d);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  void SetUp() override {
    ASSERT_EQ(corelm_model_load(dir_->c_str(), nullptr, &m_), CORELM_OK) << corelm_last_error();
    ck_.emplace(model::load_model(dir_->string()));
  }
  void TearDown() override { corelm_model_free(m_); }

  json generate(const std::vector<std::string>& prompts, const std::string& params) {
    std::vector<const char*> p;
    for (const auto& s : prompts) p.push_back(s.c_str());
    char* out = nullptr;
    EXPECT_EQ(corelm_generate(m_, p.data(), p.size(), params.c_str(), &out), CORELM_OK) << corelm_last_error();
    json j = out ? json::parse(out) : json();
    corelm_string_free(out);
    return j;
  }

  static fs::path* dir_;
  corelm_model* m_ = nullptr;
  std::optional<model::Checkpoint> ck_;
};
fs::path* CApiTest::dir_ = nullptr;

TEST_F(CApiTest, VersionAndLastErrorStartEmpty) {
  EXPECT_NE(std::string(corelm_version()).find("corelm"), std::string::npos);
  EXPECT_STREQ(corelm_last_error(), "");
}

TEST_F(CApiTest, TokenizeDetokenizeRoundTripEqualsTheCppTokenizer) {
  const std::string text = "the cat sat on a mat, and \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80!";
  size_t n = 0;
  ASSERT_EQ(corelm_tokenize(m_, text.data(), text.size(), 0, nullptr, 0, &n), CORELM_OK);
  const std::vector<TokenId> want = ck_->model.tokenizer->encode(text);
  ASSERT_EQ(n, want.size());
  std::vector<int32_t> ids(n);
  ASSERT_EQ(corelm_tokenize(m_, text.data(), text.size(), 0, ids.data(), ids.size(), &n), CORELM_OK);
  EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.end()), want);
  // Too small: the size comes back with BUFFER_TOO_SMALL.
  size_t n2 = 0;
  EXPECT_EQ(corelm_tokenize(m_, text.data(), text.size(), 0, ids.data(), 1, &n2), CORELM_BUFFER_TOO_SMALL);
  EXPECT_EQ(n2, want.size());
  EXPECT_NE(std::string(corelm_last_error()).find("ids"), std::string::npos);

  size_t len = 0;
  ASSERT_EQ(corelm_detokenize(m_, ids.data(), ids.size(), nullptr, 0, &len), CORELM_OK);
  ASSERT_EQ(len, text.size());
  std::string back(len, '\0');
  ASSERT_EQ(corelm_detokenize(m_, ids.data(), ids.size(), back.data(), back.size(), &len), CORELM_OK);
  EXPECT_EQ(back, text);
  EXPECT_EQ(corelm_detokenize(m_, ids.data(), ids.size(), back.data(), 2, &len), CORELM_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, text.size());
  // Empty text: zero ids, OK.
  EXPECT_EQ(corelm_tokenize(m_, nullptr, 0, 0, nullptr, 0, &n), CORELM_OK);
  EXPECT_EQ(n, 0u);
}

TEST_F(CApiTest, GenerateEqualsTextGeneratorGreedyAndSeeded) {
  const std::vector<std::string> prompts{"the cat", "a dog ran far", ""};
  infer::TextGenerator gen(ck_->model.decoder, *ck_->model.tokenizer);
  {
    infer::GenerateOptions o;
    o.max_new_tokens = 12;
    o.sampling.greedy = true;
    o.stop_at_eos = false;
    const auto want = gen.generate(prompts, o);
    const json got = generate(prompts, R"({"max_tokens": 12, "greedy": true, "stop_at_eos": false})");
    ASSERT_EQ(got.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i]["text"], want[i].text) << i;
      EXPECT_EQ(got[i]["tokens"].get<std::vector<TokenId>>(), want[i].tokens) << i;
      EXPECT_EQ(want[i].tokens.size(), 12u) << "greedy without EOS runs to max_tokens";
      EXPECT_EQ(got[i]["finish_reason"], want[i].finish_reason);
      EXPECT_EQ(got[i]["prompt_tokens"], want[i].prompt_tokens);
    }
  }
  {
    infer::GenerateOptions o;
    o.max_new_tokens = 10;
    o.sampling.temperature = 0.9f;
    o.sampling.top_k = 20;
    o.sampling.top_p = 0.95f;
    o.seed = 1234;
    o.stop = {"."};
    const auto want = gen.generate(prompts, o);
    const json got = generate(prompts, R"({"max_tokens": 10, "temperature": 0.9, "top_k": 20, "top_p": 0.95,
                                           "seed": 1234, "stop": ["."]})");
    ASSERT_EQ(got.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i]["text"], want[i].text) << i;
      EXPECT_EQ(got[i]["tokens"].get<std::vector<TokenId>>(), want[i].tokens) << i;
    }
  }
  EXPECT_EQ(generate({}, "{}"), json::array());
}

TEST_F(CApiTest, ClassifyProbabilitiesSumToOne) {
  const char* texts[] = {"the cat sat on a mat", "a dog ran far away home", "red blue"};
  const char* labels[] = {"yes", "no", "blue"};
  char* out = nullptr;
  ASSERT_EQ(corelm_classify(m_, texts, 3, labels, 3, &out), CORELM_OK) << corelm_last_error();
  const json j = json::parse(out);
  corelm_string_free(out);
  ASSERT_EQ(j.size(), 3u);
  for (const auto& r : j) {
    double sum = 0;
    for (const char* l : labels) {
      ASSERT_TRUE(r["probs"].contains(l)) << r.dump();
      const double p = r["probs"][l].get<double>();
      EXPECT_GE(p, 0.0);
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-9);
    EXPECT_TRUE(r["probs"].contains(r["label"].get<std::string>()));
  }
  // No labels and no head: an argument error naming labels.
  EXPECT_EQ(corelm_classify(m_, texts, 3, nullptr, 0, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(std::string(corelm_last_error()).find("labels"), std::string::npos);
  EXPECT_EQ(out, nullptr);
}

TEST_F(CApiTest, ScoreEqualsAPlainForward) {
  const std::vector<std::string> texts{"the cat sat on a mat and", "dog ran far away home."};
  std::vector<const char*> p;
  for (const auto& s : texts) p.push_back(s.c_str());
  char* out = nullptr;
  ASSERT_EQ(corelm_score(m_, p.data(), p.size(), &out), CORELM_OK) << corelm_last_error();
  const json j = json::parse(out);
  corelm_string_free(out);
  ASSERT_EQ(j.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<TokenId> ids = ck_->model.tokenizer->encode(texts[i]);
    const int64_t T = static_cast<int64_t>(ids.size()), V = ck_->model.decoder.config().vocab_size;
    const Tensor logits = ck_->model.decoder.forward(Tensor::from_vector(ids, {1, T})).contiguous();
    const float* L = logits.data<float>();
    double total = 0;
    for (int64_t t = 0; t + 1 < T; ++t) {
      const float* row = L + t * V;
      double m = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max<double>(m, row[v]);
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - m);
      total += row[ids[t + 1]] - (m + std::log(z));
    }
    EXPECT_EQ(j[i]["tokens"].get<int64_t>(), T - 1);
    EXPECT_NEAR(j[i]["logprob"].get<double>(), total, 1e-3 * std::abs(total) + 1e-4) << texts[i];
  }
  // A one-token text cannot be scored: an error entry, the others still scored.
  const char* mixed[] = {"a", "the cat sat"};
  ASSERT_EQ(corelm_score(m_, mixed, 2, &out), CORELM_OK);
  const json k = json::parse(out);
  corelm_string_free(out);
  EXPECT_TRUE(k[0].contains("error")) << k.dump();
  EXPECT_TRUE(k[1].contains("logprob")) << k.dump();
}

std::string last() { return corelm_last_error(); }

TEST_F(CApiTest, BadInputGivesStatusAndANamedError) {
  corelm_model* bad = reinterpret_cast<corelm_model*>(0x1);
  EXPECT_EQ(corelm_model_load(nullptr, nullptr, &bad), CORELM_INVALID_ARGUMENT);
  EXPECT_EQ(bad, nullptr);
  EXPECT_NE(last().find("path"), std::string::npos) << last();
  EXPECT_EQ(corelm_model_load(dir_->c_str(), nullptr, nullptr), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("out"), std::string::npos) << last();
  EXPECT_EQ(corelm_model_load("/nonexistent/corelm/model", nullptr, &bad), CORELM_IO_ERROR);
  EXPECT_NE(last().find("/nonexistent/corelm/model"), std::string::npos) << last();
  // A folder whose config.json is garbage: a format error naming the file.
  const fs::path broken = fs::path(*dir_).concat("_broken");
  fs::create_directories(broken);
  std::ofstream(broken / "config.json") << "{not json";
  const corelm_status s = corelm_model_load(broken.c_str(), nullptr, &bad);
  EXPECT_TRUE(s == CORELM_FORMAT_ERROR || s == CORELM_IO_ERROR) << s << " " << last();
  EXPECT_NE(last().find("config.json"), std::string::npos) << last();
  fs::remove_all(broken);
  EXPECT_EQ(corelm_model_load(dir_->c_str(), "{\"strict\": ", &bad), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("options_json"), std::string::npos) << last();
  EXPECT_EQ(corelm_model_load(dir_->c_str(), "{\"colour\": 1}", &bad), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("colour"), std::string::npos) << last();

  size_t n = 0;
  int32_t ids[4] = {0, 1, 2, 100000};
  EXPECT_EQ(corelm_tokenize(nullptr, "x", 1, 0, nullptr, 0, &n), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("model"), std::string::npos) << last();
  EXPECT_EQ(corelm_tokenize(m_, nullptr, 3, 0, nullptr, 0, &n), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("text"), std::string::npos) << last();
  EXPECT_EQ(corelm_tokenize(m_, "x", 1, 0, nullptr, 0, nullptr), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("n is NULL"), std::string::npos) << last();
  EXPECT_EQ(corelm_detokenize(m_, nullptr, 2, nullptr, 0, &n), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("ids"), std::string::npos) << last();
  EXPECT_EQ(corelm_detokenize(m_, ids, 4, nullptr, 0, &n), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("ids[3]"), std::string::npos) << last();
  EXPECT_EQ(corelm_detokenize(m_, ids, 1, nullptr, 0, nullptr), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("len"), std::string::npos) << last();

  char* out = reinterpret_cast<char*>(0x1);
  const char* prompts[] = {"the", nullptr};
  EXPECT_EQ(corelm_generate(m_, prompts, 1, "{\"max_tokens\": ", &out), CORELM_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(last().find("params_json"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 1, "[1]", &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("params_json"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 1, "{\"max_tokens\": \"many\"}", &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("max_tokens"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 1, "{\"max_tokens\": 3.5}", &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("max_tokens"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 1, "{\"seed\": -1}", &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("seed"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 1, "{\"temprature\": 1}", &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("temprature"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 1, "{\"top_p\": 0}", &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("top_p"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 2, nullptr, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("prompts[1]"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, nullptr, 1, nullptr, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("prompts"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(m_, prompts, 1, nullptr, nullptr), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("out_json"), std::string::npos) << last();
  EXPECT_EQ(corelm_generate(nullptr, prompts, 1, nullptr, &out), CORELM_INVALID_ARGUMENT);
  // A prompt longer than the context (64): the library's ValueError comes back as a status.
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "the cat sat ";
  const char* lp[] = {long_prompt.c_str()};
  EXPECT_EQ(corelm_generate(m_, lp, 1, nullptr, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("context"), std::string::npos) << last();

  const char* labels[] = {"yes", nullptr};
  EXPECT_EQ(corelm_classify(m_, prompts, 1, labels, 2, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("labels[1]"), std::string::npos) << last();
  EXPECT_EQ(corelm_classify(m_, nullptr, 1, labels, 1, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("texts"), std::string::npos) << last();
  EXPECT_EQ(corelm_score(m_, prompts, 2, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("texts[1]"), std::string::npos) << last();
  EXPECT_EQ(corelm_score(nullptr, prompts, 1, &out), CORELM_INVALID_ARGUMENT);
  EXPECT_NE(last().find("model"), std::string::npos) << last();

  // A successful call clears the message; freeing NULL is a no-op.
  EXPECT_EQ(corelm_tokenize(m_, "x", 1, 0, nullptr, 0, &n), CORELM_OK);
  EXPECT_STREQ(corelm_last_error(), "");
  corelm_model_free(nullptr);
  corelm_string_free(nullptr);
}

// Only the corelm_* entry points leave the shared library.
TEST(CApiLibrary, ExportsOnlyCorelmSymbols) {
  if (!corelm::testing::have_program("nm")) GTEST_SKIP() << "nm (binutils) is not installed";
  const auto r = corelm::testing::run_program("/bin/sh", {"-c", "nm -D --defined-only " + lib_path()},
                                              corelm::testing::CliOptions{30});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream in(r.out);
  std::string line;
  int exported = 0;
  while (std::getline(in, line)) {
    const auto sp = line.rfind(' ');
    const std::string name = line.substr(sp + 1);
    const char kind = sp >= 1 ? line[sp - 1] : '?';
    if (kind != 'T' && kind != 'D' && kind != 'B' && kind != 'W' && kind != 'V' && kind != 'u' && kind != 'R') continue;
    // Symbols the linker itself defines in every shared object.
    if (name == "_init" || name == "_fini" || name == "__bss_start" || name == "_edata" || name == "_end") continue;
    EXPECT_EQ(name.rfind("corelm_", 0), 0u) << "libcorelm.so exports " << line;
    ++exported;
  }
  EXPECT_EQ(exported, 10) << r.out;
}

// The header is plain C99.
TEST(CApiLibrary, HeaderCompilesAsC99) {
  if (!corelm::testing::have_program("cc")) GTEST_SKIP() << "no C compiler (cc)";
  const std::string src = std::string(CORELM_SOURCE_DIR) + "/tests/capi/c_smoke.c";
  const auto r = corelm::testing::run_program(
      "/bin/sh",
      {"-c", "cc -std=c99 -pedantic -Wall -Wextra -Werror -fsyntax-only -I " + std::string(CORELM_SOURCE_DIR) +
                 "/include " + src},
      corelm::testing::CliOptions{60});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
}

// python/corelm/local.py (ctypes) against the same library: tests/capi/test_local_model.py.
TEST_F(CApiTest, PythonLocalModelMatchesTheCApi) {
  if (!corelm::testing::have_program("python3")) GTEST_SKIP() << "python3 is not installed";
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "an ASan-built libcorelm.so cannot be loaded by an uninstrumented python3";
#endif
  const json want = generate({"the cat", "a dog"}, R"({"max_tokens": 8, "greedy": true, "stop_at_eos": false})");
  const fs::path expected = fs::path(*dir_) / "expected.json";
  std::ofstream(expected) << want.dump();
  const std::string src = CORELM_SOURCE_DIR;
  corelm::testing::CliOptions o{60};
  o.env = {"CORELM_LIB=" + lib_path(), "PYTHONPATH=" + src + "/python"};
  const auto r = corelm::testing::run_program(
      "/bin/sh", {"-c", "exec python3 " + src + "/tests/capi/test_local_model.py " + dir_->string() + " " + expected.string()},
      o);
  fs::remove(expected);
  std::cout << r.out << r.err;
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("SUMMARY OK"), std::string::npos);
}

}  // namespace
