// BPE training: output loads in corelm and in Hugging Face tokenizers with identical ids, is
// deterministic, round-trips any input, and bad options fail clearly.
#include <gtest/gtest.h>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"
#include "tokenizer/oracle.h"
#include "tokenizer/random_text.h"
#include "tokenizer/test_util.h"
#include "tokenizer/tiny_tokenizer.h"

namespace corelm {
namespace {

// A corpus with a Zipf-like word distribution, so there is something to learn.
std::string make_corpus(size_t words, uint64_t seed) {
  static const std::vector<std::string> vocab = {"the", "and", "of", "to", "tokenizer", "merge", "byte", "pair",
                                                 "encoding", "learns", "from", "corpus", "it's", "they'll", "2024",
                                                 "caf\xC3\xA9", "na\xC3\xAFve", "\xE6\x88\x91\xE4\xBB\xAC", "\xF0\x9F\x9A\x80"};
  test::RandomText gen(seed);
  std::string out;
  for (size_t i = 0; i < words; ++i) {
    size_t r = gen.rng()() % 1000;
    if (r < 900) out += vocab[(r * r) % vocab.size()];
    else out += gen.unicode(2);
    out += (i % 13 == 12) ? "\n" : (i % 7 == 6 ? ", " : " ");
  }
  return out;
}

std::string train_to_temp(const std::string& corpus, BpeTrainOptions opt) {
  auto dir = test::fresh_temp_dir("train");
  std::string input = (dir / "corpus.txt").string(), output = (dir / "tokenizer.json").string();
  std::ofstream(input, std::ios::binary) << corpus;
  train_bpe({input}, opt, output);
  return output;
}

TEST(Train, LearnsLoadsAndRoundTrips) {
  BpeTrainOptions opt;
  opt.vocab_size = 400;
  std::string path = train_to_temp(make_corpus(40000, 1), opt);
  auto tok = Tokenizer::load(path);
  EXPECT_EQ(tok->vocab_size(), 400u);
  ASSERT_TRUE(tok->token_to_id("<|endoftext|>").has_value());
  EXPECT_EQ(*tok->token_to_id("<|endoftext|>"), 399);
  auto ids = tok->encode(" the tokenizer");
  EXPECT_LE(ids.size(), 3u);  // frequent words became tokens
  test::RandomText gen(7);
  for (int i = 0; i < 300; ++i) {
    std::string u = gen.unicode(), b = gen.bytes();
    EXPECT_EQ(tok->decode(tok->encode(u)), u);
    EXPECT_EQ(tok->decode(tok->encode(b)), b);
  }
}

TEST(Train, IsDeterministicAndMemoryBounded) {
  std::string corpus = make_corpus(20000, 2);
  BpeTrainOptions opt;
  opt.vocab_size = 350;
  opt.pattern = "llama3";
  std::string a = test::slurp(train_to_temp(corpus, opt)), b = test::slurp(train_to_temp(corpus, opt));
  EXPECT_EQ(a, b);
  opt.max_distinct_words = 64;  // forces pruning of rare words while counting
  auto tok = Tokenizer::load(train_to_temp(corpus, opt));
  EXPECT_EQ(tok->decode(tok->encode(corpus)), corpus);
}

TEST(Train, HuggingFaceLoadsItWithIdenticalIds) {
  for (const char* pattern : {"gpt2", "qwen2"}) {
    BpeTrainOptions opt;
    opt.vocab_size = 500;
    opt.pattern = pattern;
    std::string path = train_to_temp(make_corpus(30000, 3), opt);
    auto tok = Tokenizer::load(path);
    test::RandomText gen(9);
    std::vector<std::string> texts;
    for (int i = 0; i < 500; ++i) texts.push_back(gen.unicode());
    std::string why;
    auto want = test::run_oracle("hf", "--tokenizer " + path, texts, &why);
    if (!want) GTEST_SKIP() << why;
    EncodeOptions parse;
    parse.parse_special = true;
    int same = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      auto got = tok->encode(texts[i], parse);
      EXPECT_EQ(got, (*want)[i]["ids"].get<std::vector<TokenId>>()) << pattern << ": " << nlohmann::json(texts[i]).dump();
      same += got == (*want)[i]["ids"].get<std::vector<TokenId>>();
    }
    std::cout << "[ train ] " << pattern << " trained tokenizer vs HF: " << same << "/" << texts.size() << " identical\n";
  }
}

TEST(Train, BadOptions) {
  BpeTrainOptions opt;
  opt.vocab_size = 200;
  EXPECT_THROW(train_to_temp("abc", opt), ValueError);
  opt.vocab_size = 300;
  opt.pattern = "bert";
  EXPECT_THROW(train_to_temp("abc", opt), ValueError);
  opt.pattern = "gpt2";
  EXPECT_THROW(train_bpe({"/nonexistent/corpus.txt"}, opt, "/tmp/unused.json"), IOError);
}

}  // namespace
}  // namespace corelm
