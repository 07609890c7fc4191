// llama2.c readers on synthetic files: header parsing, HF naming, the RoPE row un-permutation,
// the untied classifier, tokenizer encode/decode rules, and malformed files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <string>

#include "corelm/error.h"
#include "corelm/gguf.h"
#include "corelm/llama2c.h"

namespace corelm::io {
namespace {

namespace fs = std::filesystem;

class Llama2cTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_l2c_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  static void write(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  }
  // Checkpoint whose float k holds the value k (so every tensor's origin is visible).
  std::string checkpoint(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv, int32_t vocab,
                         int32_t seq, int64_t n_floats) {
    std::string s(28, '\0');
    int32_t h[7] = {dim, hidden, layers, heads, kv, vocab, seq};
    std::memcpy(s.data(), h, 28);
    for (int64_t k = 0; k < n_floats; ++k) {
      float f = static_cast<float>(k);
      s.append(reinterpret_cast<const char*>(&f), 4);
    }
    return s;
  }
  fs::path dir_;
};

// dim 8 = 2 heads of 4, 1 KV head, FFN 6, 1 layer, vocab 5, seq_len 3.
constexpr int32_t D = 8, H = 6, L = 1, NH = 2, NKV = 1, V = 5, S = 3;
constexpr int64_t HD = D / NH, KV = NKV * HD;
constexpr int64_t kTied = V * D + L * (2 * D + D * D + 2 * D * KV + D * D + 3 * D * H) + D + S * HD;

// The arrays come back in file order under llama2.c's own names, per-layer ones stacked, rows as
// stored; turning them into the decoder's parameters is model::llama2c_model's job
// (tests/model/test_architecture.cc).
TEST_F(Llama2cTest, ArraysKeepLlama2cNamesAndFileOrder) {
  write(path("m.bin"), checkpoint(D, H, L, NH, NKV, V, S, kTied));
  auto ck = load_llama2c_checkpoint(path("m.bin"));
  EXPECT_TRUE(ck.header.shared_classifier);
  EXPECT_EQ(ck.header.dim, D);
  EXPECT_EQ(ck.header.n_kv_heads, NKV);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"token_embedding_table", {V, D}}, {"rms_att_weight", {L, D}}, {"wq", {L, D, D}},    {"wk", {L, KV, D}},
      {"wv", {L, KV, D}},                {"wo", {L, D, D}},          {"rms_ffn_weight", {L, D}}, {"w1", {L, H, D}},
      {"w2", {L, D, H}},                 {"w3", {L, H, D}},          {"rms_final_weight", {D}}};
  ASSERT_EQ(ck.tensors.size(), want.size());
  int64_t offset = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(ck.tensors[i].first, want[i].first);
    EXPECT_EQ(ck.tensors[i].second.shape(), want[i].second) << want[i].first;
    // Float k of the file holds k: each array starts where the previous one ended, unpermuted.
    EXPECT_EQ(ck.tensors[i].second.to_float_vector()[0], static_cast<float>(offset)) << want[i].first;
    offset += ck.tensors[i].second.numel();
  }
  auto wq = ck.tensors[2].second.to_float_vector();
  for (int64_t r = 0; r < D; ++r) EXPECT_EQ(wq[r * D], static_cast<float>(V * D + L * D + r * D)) << "row " << r;
}

TEST_F(Llama2cTest, NegativeVocabMeansSeparateClassifier) {
  write(path("u.bin"), checkpoint(D, H, L, NH, NKV, -V, S, kTied + V * D));
  auto ck = load_llama2c_checkpoint(path("u.bin"));
  EXPECT_FALSE(ck.header.shared_classifier);
  EXPECT_EQ(ck.header.vocab_size, V);
  ASSERT_EQ(ck.tensors.back().first, "wcls");
  EXPECT_EQ(ck.tensors.back().second.shape(), (Shape{V, D}));
  EXPECT_EQ(ck.tensors.back().second.to_float_vector()[0], static_cast<float>(kTied));
}

TEST_F(Llama2cTest, MalformedFilesNameTheFile) {
  write(path("short.bin"), checkpoint(D, H, L, NH, NKV, V, S, kTied - 1));
  write(path("hdr.bin"), std::string(10, '\0'));
  write(path("bad.bin"), checkpoint(D, H, L, 3, NKV, V, S, kTied));
  for (const char* name : {"short.bin", "hdr.bin", "bad.bin"}) {
    try {
      load_llama2c_checkpoint(path(name));
      ADD_FAILURE() << name << " loaded";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(load_llama2c_checkpoint(path("missing.bin")), IOError);
}

// A FIFO or a device has no size to check against the header and may never end: refused before
// a byte is read (a FIFO without a writer would block the open itself). A file larger than its
// header implies is refused from its size alone (a sparse 4 GB file here).
TEST_F(Llama2cTest, NonRegularAndOversizedFilesAreRefusedUnread) {
  ASSERT_EQ(::mkfifo(path("m.fifo").c_str(), 0600), 0);
  for (const std::string& p : {std::string("/dev/zero"), path("m.fifo")}) {
    try {
      load_llama2c_checkpoint(p);
      ADD_FAILURE() << p << " loaded";
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
    EXPECT_THROW(read_llama2c_header(p), IOError);
    EXPECT_THROW(Llama2cTokenizer::load(p), IOError);
  }
  write(path("big.bin"), checkpoint(D, H, L, NH, NKV, V, S, 0));
  fs::resize_file(path("big.bin"), 4ull << 30);
  try {
    load_llama2c_checkpoint(path("big.bin"));
    ADD_FAILURE() << "a 4 GB file loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("4294967296 bytes but its header"), std::string::npos) << e.what();
  }
}

std::string tokenizer_bytes(const std::vector<std::pair<std::string, float>>& toks) {
  std::string s;
  int32_t max_len = 8;
  s.append(reinterpret_cast<const char*>(&max_len), 4);
  for (auto& [p, score] : toks) {
    int32_t len = static_cast<int32_t>(p.size());
    s.append(reinterpret_cast<const char*>(&score), 4);
    s.append(reinterpret_cast<const char*>(&len), 4);
    s += p;
  }
  return s;
}

TEST_F(Llama2cTest, TokenizerEncodeDecodeRules) {
  // ids 0..2 specials, 3..258 bytes, then pieces.
  std::vector<std::pair<std::string, float>> toks = {{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    toks.emplace_back(buf, 0);
  }
  toks.insert(toks.end(), {{" ", -1}, {"a", -2}, {"b", -3}, {" a", -4}, {"ab", -5}, {" ab", -6}});
  write(path("tok.bin"), tokenizer_bytes(toks));
  auto tok = Llama2cTokenizer::load(path("tok.bin"));
  ASSERT_EQ(tok.vocab_size(), 265);
  // " a" (score -4) merges before "ab" (-5); then " a"+"b" -> " ab".
  EXPECT_EQ(tok.encode("ab", true, true), (std::vector<int64_t>{1, 264, 2}));
  // "c" is not a piece: byte fallback 'c' + 3.
  EXPECT_EQ(tok.encode("ac", false, false), (std::vector<int64_t>{262, 'c' + 3}));
  EXPECT_TRUE(tok.encode("", false, false).empty());
  EXPECT_EQ(tok.decode(1, 262), "a");   // leading space stripped after BOS
  EXPECT_EQ(tok.decode(5, 262), " a");
  EXPECT_EQ(tok.decode(5, 'c' + 3), "c");  // <0x63>
  EXPECT_EQ(Llama2cTokenizer::printable(std::string(1, '\x01')), "");
  EXPECT_EQ(Llama2cTokenizer::printable("\n"), "\n");
  EXPECT_THROW(tok.piece(265), IndexError);
  write(path("trunc.bin"), tokenizer_bytes(toks).substr(0, 100));
  EXPECT_THROW(Llama2cTokenizer::load(path("trunc.bin"), 265), FormatError);
}

// The Llama 2 vocabulary in llama2.c format, turned into GGUF tokenizer keys, equals what
// llama.cpp's converter wrote from tokenizer.model (ggml-vocab-llama-spm.gguf).
TEST(Llama2cRealFiles, Llama2VocabMatchesLlamaCppGguf) {
  const fs::path data = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data" / "tokenizers";
  const fs::path bin = data / "llama2" / "tokenizer.bin", gguf = data / "llama.cpp-vocab-tests" / "ggml-vocab-llama-spm.gguf";
  if (!fs::exists(bin) || !fs::exists(gguf)) GTEST_SKIP() << "shared data set absent (" << data.string() << ")";
  auto tok = Llama2cTokenizer::load(bin.string());
  ASSERT_EQ(tok.vocab_size(), 32000);
  auto ref = GGUFFile::open(gguf.string());
  auto meta = tok.gguf_metadata();
  std::map<std::string, GGUFValue> ours(meta.begin(), meta.end());
  for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token"})
    EXPECT_TRUE(ours.at(key) == ref.at(key)) << key;
  for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
    const auto& a = ours.at(key).array;
    const auto& b = ref.at(key).array;
    ASSERT_EQ(a.size(), b.size()) << key;
    int64_t mismatches = 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i]) && mismatches++ < 5) ADD_FAILURE() << key << "[" << i << "] differs";
    EXPECT_EQ(mismatches, 0) << key;
  }
}

// The reverse: llama.cpp's GGUF vocabulary read back (from_gguf_pieces) encodes and decodes like the
// llama2.c tokenizer.bin, with .inp/.out llama.cpp test strings as inputs.
TEST(Llama2cRealFiles, GgufVocabEncodesLikeTokenizerBin) {
  const fs::path data = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data" / "tokenizers";
  const fs::path bin = data / "llama2" / "tokenizer.bin", gguf = data / "llama.cpp-vocab-tests" / "ggml-vocab-llama-spm.gguf";
  if (!fs::exists(bin) || !fs::exists(gguf)) GTEST_SKIP() << "shared data set absent (" << data.string() << ")";
  auto ref = Llama2cTokenizer::load(bin.string());
  auto file = GGUFFile::open(gguf.string());
  std::vector<std::string> pieces;
  std::vector<float> scores;
  for (const auto& t : file.at("tokenizer.ggml.tokens").array) pieces.push_back(t.as_string());
  for (const auto& s : file.at("tokenizer.ggml.scores").array) scores.push_back(static_cast<float>(s.as_float()));
  auto tok = Llama2cTokenizer::from_gguf_pieces(pieces, scores, gguf.string());
  for (const char* text : {"Hello world", " leading space", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
                           "tabs\tand\nnewlines", "3.14159 + 2 = 5.14159"}) {
    EXPECT_EQ(tok.encode(text, true, false), ref.encode(text, true, false)) << text;
    auto ids = ref.encode(text, true, false);
    for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(tok.decode(ids[i - 1], ids[i]), ref.decode(ids[i - 1], ids[i]));
  }
  // Byte fallback needs <0xXX> at id byte + 3: a vocabulary without it is refused, naming the token.
  pieces[3 + 0x41] = "A";
  EXPECT_THROW(Llama2cTokenizer::from_gguf_pieces(pieces, scores, "bad.gguf"), FormatError);
  scores.pop_back();
  EXPECT_THROW(Llama2cTokenizer::from_gguf_pieces(pieces, scores, "bad.gguf"), FormatError);
}

// run.c's encoder as written there: rescans every adjacent pair for each merge (quadratic). The
// library encodes with a heap instead; both must produce the same ids on real vocabularies.
std::vector<int64_t> quadratic_run_c_encode(const Llama2cTokenizer& tok, const std::string& text) {
  std::map<std::string, int64_t> index;
  for (int64_t id = tok.vocab_size() - 1; id >= 0; --id) index[tok.piece(id)] = id;  // first id wins
  auto lookup = [&](const std::string& s) -> int64_t {
    auto it = index.find(s);
    return it == index.end() ? -1 : it->second;
  };
  std::vector<int64_t> ids;
  if (!text.empty()) ids.push_back(lookup(" "));
  std::string cp;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) cp.clear();
    cp.push_back(static_cast<char>(c));
    if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80 && cp.size() < 4) continue;
    const int64_t id = lookup(cp);
    if (id >= 0) ids.push_back(id);
    else
      for (unsigned char b : cp) ids.push_back(static_cast<int64_t>(b) + 3);
    cp.clear();
  }
  while (true) {
    float best = -1e10f;
    int64_t best_id = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const int64_t id = lookup(tok.piece(ids[i]) + tok.piece(ids[i + 1]));
      if (id >= 0 && tok.score(id) > best) {
        best = tok.score(id);
        best_id = id;
        at = i;
      }
    }
    if (best_id < 0) break;
    ids[at] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return ids;
}

TEST(Llama2cRealFiles, HeapMergesEqualRunCQuadraticMerges) {
  const fs::path data = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data";
  const fs::path llama2 = data / "tokenizers" / "llama2" / "tokenizer.bin";
  const fs::path tok512 = data / "models" / "stories260K" / "tok512.bin";
  const fs::path stories = data / "corpus" / "tinystories_valid_head.txt";
  const fs::path inputs = data / "tokenizers" / "llama.cpp-vocab-tests" / "ggml-vocab-llama-spm.gguf.inp";
  if (!fs::exists(llama2) || !fs::exists(tok512) || !fs::exists(stories) || !fs::exists(inputs))
    GTEST_SKIP() << "shared data set absent (" << data.string() << ")";
  std::vector<std::string> texts;
  {
    std::ifstream in(inputs, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The .inp file separates its test strings with lines of "__ggml_vocab_test__" (CRLF line
    // ends); exact boundaries do not matter for a differential test.
    const std::string sep = "__ggml_vocab_test__";
    for (size_t at = 0; at < all.size();) {
      size_t end = all.find(sep, at);
      if (end == std::string::npos) end = all.size();
      texts.push_back(all.substr(at, end - at));
      at = end + sep.size();
    }
    std::ifstream s(stories, std::ios::binary);
    std::string story(3000, '\0');
    s.read(story.data(), static_cast<std::streamsize>(story.size()));
    story.resize(static_cast<size_t>(s.gcount()));
    texts.push_back(story);  // long enough that merge order across the whole text matters
  }
  ASSERT_GT(texts.size(), 10u);
  for (const fs::path& vocab : {llama2, tok512}) {
    const auto tok = Llama2cTokenizer::load(vocab.string());
    for (const std::string& text : texts) {
      auto ids = tok.encode(text, false, false);
      EXPECT_EQ(ids, quadratic_run_c_encode(tok, text)) << vocab.filename() << ": " << text.substr(0, 40);
    }
  }
}

}  // namespace
}  // namespace corelm::io
