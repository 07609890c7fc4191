// Property tests on the real tokenizers (shared data): decode(encode(x)) == x for random Unicode
// strings and random bytes, the streaming decoder agrees with decode(), and splitting a real
// corpus across threads changes no id.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_corpus.h"
#include "tokenizer/random_text.h"
#include "tokenizer/test_util.h"
#include "tokenizer/unicode.h"

namespace corelm {
namespace {

class RealTokenizer : public ::testing::TestWithParam<const char*> {};

std::string spm_expected(const Tokenizer& tok, std::string s) {
  s = tok.normalize(s);  // Qwen2 round-trips to the NFC form
  // SentencePiece turns a literal U+2581 into a space, as the reference library does.
  if (tok.strips_leading_space())
    for (size_t p; (p = s.find("\xE2\x96\x81")) != std::string::npos;) s.replace(p, 3, " ");
  return s;
}

TEST_P(RealTokenizer, RoundTripsRandomUnicodeAndBytes) {
  std::string path = test::tokenizers_dir() + "/" + GetParam();
  CORELM_REQUIRE_FILE(path);
  auto tok = Tokenizer::load(path);
  test::RandomText gen(21);
  EncodeOptions parse;
  parse.parse_special = true;
  for (int i = 0; i < 1500; ++i) {
    std::string u = gen.unicode(), b = gen.bytes();
    auto ids = tok->encode(u);
    std::string want = spm_expected(*tok, u);
    ASSERT_EQ(tok->decode(ids), want) << nlohmann::json(u).dump();
    ASSERT_EQ(tok->decode(tok->encode(u, parse)), want);
    ASSERT_EQ(tok->decode(tok->encode(b)), spm_expected(*tok, b));
    StreamingDecoder stream(*tok, /*skip_special=*/false);
    std::string streamed;
    for (TokenId id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    ASSERT_EQ(streamed, want);
    StreamingDecoder bytes_stream(*tok, false);
    std::string s2;
    for (TokenId id : tok->encode(b)) s2 += bytes_stream.push(id);
    s2 += bytes_stream.flush();
    ASSERT_TRUE(tok::is_valid_utf8(s2));
    ASSERT_EQ(s2, tok::to_valid_utf8(spm_expected(*tok, b)));
  }
}

TEST_P(RealTokenizer, ParallelCorpusEncodeIsExact) {
  std::string path = test::tokenizers_dir() + "/" + GetParam();
  std::string corpus = test::shared_data() + "/wikitext-2/wiki.valid.raw";
  CORELM_REQUIRE_FILE(path);
  CORELM_REQUIRE_FILE(corpus);
  auto tok = Tokenizer::load(path);
  std::string text = test::slurp(corpus).substr(0, 400000);
  EXPECT_EQ(encode_parallel(*tok, text, {}, 4), tok->encode(text));
}

INSTANTIATE_TEST_SUITE_P(Shared, RealTokenizer,
                         ::testing::Values("gpt2/tokenizer.json", "llama3/tokenizer.json.zst", "qwen3/tokenizer.json.zst",
                                           "llama2/tokenizer.model"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n.substr(0, n.find('/'));
                         });

}  // namespace
}  // namespace corelm
