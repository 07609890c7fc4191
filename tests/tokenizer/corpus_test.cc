// Corpus tokenization: multi-threaded results equal single-threaded encode() exactly, and the
// binary token file holds exactly those ids.
#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_corpus.h"
#include "corelm/tokenizer_train.h"
#include "tokenizer/oracle.h"
#include "tokenizer/random_text.h"
#include "tokenizer/test_util.h"
#include "tokenizer/tiny_tokenizer.h"

namespace corelm {
namespace {

std::string multiline_text(size_t lines, uint64_t seed) {
  test::RandomText gen(seed);
  std::string s;
  for (size_t i = 0; i < lines; ++i) {
    s += gen.unicode(12);
    s += (i % 5 == 0) ? "\n\n" : "\n";
  }
  return s;
}

std::vector<TokenId> read_ids(const std::string& path, int width) {
  std::string raw = test::slurp(path);
  std::vector<TokenId> ids(raw.size() / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, raw.data() + i * width, width);
    ids[i] = static_cast<TokenId>(v);
  }
  return ids;
}

std::unique_ptr<Tokenizer> small_tokenizer(const char* pattern) {
  auto dir = test::fresh_temp_dir("corpus_tok");
  std::ofstream(dir / "c.txt") << multiline_text(3000, 5);
  BpeTrainOptions opt;
  opt.vocab_size = 600;
  opt.pattern = pattern;
  train_bpe({(dir / "c.txt").string()}, opt, (dir / "tokenizer.json").string());
  return Tokenizer::load((dir / "tokenizer.json").string());
}

TEST(Corpus, ParallelEncodeEqualsSerial) {
  for (const char* pattern : {"gpt2", "llama3", "qwen2"}) {
    auto tok = small_tokenizer(pattern);
    ASSERT_TRUE(tok->splits_at_newlines());
    std::string text = multiline_text(20000, 6);
    EncodeOptions opt;
    opt.add_special = true;
    auto serial = tok->encode(text, opt);
    for (int threads : {2, 3, 8}) EXPECT_EQ(encode_parallel(*tok, text, opt, threads), serial) << pattern << " " << threads;
  }
}

TEST(Corpus, TokenFileMatchesEncodeForAnyThreadCount) {
  auto tok = small_tokenizer("gpt2");
  auto dir = test::fresh_temp_dir("corpus");
  std::string a = (dir / "a.txt").string(), b = (dir / "b.txt").string();
  std::string ta = multiline_text(15000, 7), tb = multiline_text(100, 8);
  std::ofstream(a, std::ios::binary) << ta;
  std::ofstream(b, std::ios::binary) << tb;
  std::vector<TokenId> want;
  EncodeOptions eo;
  eo.add_special = true;
  tok->encode_append(ta, eo, want);
  tok->encode_append(tb, eo, want);
  for (int threads : {1, 3}) {
    TokenFileOptions opt;
    opt.threads = threads;
    opt.add_special = true;
    opt.chunk_bytes = 4096;  // many blocks and cuts even for a small file
    std::string out = (dir / ("out" + std::to_string(threads) + ".bin")).string();
    TokenFileStats s = tokenize_to_file(*tok, {a, b}, out, opt);
    EXPECT_EQ(s.dtype_bytes, 2);
    EXPECT_EQ(s.documents, 2u);
    EXPECT_EQ(read_ids(out, 2), want) << threads << " threads";
    auto meta = nlohmann::json::parse(test::slurp(out + ".json"));
    EXPECT_EQ(meta["dtype"], "uint16");
    EXPECT_EQ(meta["tokens"].get<size_t>(), want.size());
  }
}

TEST(Corpus, JsonlDocumentsAndUint32) {
  auto tok = small_tokenizer("gpt2");
  auto dir = test::fresh_temp_dir("jsonl");
  std::string in = (dir / "docs.jsonl").string(), out = (dir / "docs.bin").string();
  test::RandomText gen(10);
  std::vector<std::string> docs;
  {
    std::ofstream f(in);
    for (int i = 0; i < 500; ++i) {
      docs.push_back(gen.unicode() + "\nsecond line");
      f << (i % 2 ? nlohmann::json(docs.back()) : nlohmann::json{{"text", docs.back()}, {"id", i}}).dump() << "\n";
    }
  }
  TokenFileOptions opt;
  opt.threads = 3;
  opt.jsonl = true;
  opt.add_special = true;
  opt.dtype = TokenDType::kUInt32;
  opt.chunk_bytes = 2048;
  TokenFileStats s = tokenize_to_file(*tok, {in}, out, opt);
  std::vector<TokenId> want;
  EncodeOptions eo;
  eo.add_special = true;
  for (const auto& d : docs) tok->encode_append(d, eo, want);
  EXPECT_EQ(s.documents, docs.size());
  EXPECT_EQ(read_ids(out, 4), want);
  std::ofstream(in, std::ios::app) << "{not json\n";
  EXPECT_THROW(tokenize_to_file(*tok, {in}, out, opt), FormatError);
}

}  // namespace
}  // namespace corelm
