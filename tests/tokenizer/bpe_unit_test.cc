// BPE, pre-tokenizer, added-token and decoder behaviour on tokenizers the tests build themselves.
#include <gtest/gtest.h>

#include <algorithm>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/unicode.h"

namespace corelm {
namespace {

using Strings = std::vector<std::string>;
using test::pieces;

test::TinySpec hello_spec() {
  test::TinySpec s;
  s.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"a", "a"}, {"aa", "aa"}};
  return s;
}

TEST(Bpe, AppliesMergesByRank) {
  auto tok = test::load_tiny(hello_spec());
  EXPECT_EQ(pieces(*tok, tok->encode("hello world")), (Strings{"hello", " w", "o", "r", "l", "d"}));
  EXPECT_EQ(pieces(*tok, tok->encode("aaa")), (Strings{"aa", "a"}));  // leftmost pair first on ties
  EXPECT_EQ(pieces(*tok, tok->encode("aaaaa")), (Strings{"aaaa", "a"}));
}

TEST(Bpe, LongPiecesUseTheHeapPathWithTheSameResult) {
  auto tok = test::load_tiny(hello_spec());
  std::string long_run(1001, 'a');
  auto ids = tok->encode(long_run);
  ASSERT_EQ(ids.size(), 251u);
  for (size_t i = 0; i < 250; ++i) EXPECT_EQ(tok->token_bytes(ids[i]), "aaaa");
  EXPECT_EQ(tok->token_bytes(ids[250]), "a");
  EXPECT_EQ(tok->decode(ids), long_run);
}

TEST(Bpe, WholeTokenShortcutOnlyWhenMergesReachIt) {
  test::TinySpec s;
  s.merges = {{"x", "y"}};
  s.extra_tokens = {"xyz"};  // in the vocabulary, but no merge builds it
  auto tok = test::load_tiny(s);
  EXPECT_EQ(pieces(*tok, tok->encode("xyz")), (Strings{"xy", "z"}));
  s.ignore_merges = true;  // Llama 3: a whole pre-token in the vocabulary wins
  auto llama_like = test::load_tiny(s);
  EXPECT_EQ(pieces(*llama_like, llama_like->encode("xyz")), (Strings{"xyz"}));
}

TEST(Bpe, AddedTokensAndSpecialTokenPolicy) {
  test::TinySpec s = hello_spec();
  s.added_tokens = {{{"id", 263}, {"content", "<|eot|>"}, {"special", true}},
                    {{"id", 264}, {"content", "<mask>"}, {"special", false}}};
  s.post_processor = {{"type", "TemplateProcessing"},
                      {"single", {{{"SpecialToken", {{"id", "<|eot|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                      {"special_tokens", {{"<|eot|>", {{"id", "<|eot|>"}, {"ids", {263}}, {"tokens", {"<|eot|>"}}}}}}};
  auto tok = test::load_tiny(s);
  EncodeOptions parse;
  parse.parse_special = true;
  EXPECT_EQ(tok->encode("hello<|eot|>", parse).back(), 263);
  auto plain = tok->encode("hello<|eot|>");  // default: special-token text is plain text
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 263), 0);
  EXPECT_EQ(tok->decode(plain), "hello<|eot|>");
  EXPECT_EQ(tok->encode("a<mask>b")[1], 264);  // non-special added tokens always match
  EncodeOptions bos;
  bos.add_special = true;
  EXPECT_EQ(tok->encode("hello", bos).front(), 263);
  EXPECT_EQ(tok->decode(tok->encode("hello<|eot|>", parse), /*skip_special=*/true), "hello");
  EXPECT_TRUE(tok->is_special(263));
  EXPECT_FALSE(tok->is_special(264));
}

TEST(Bpe, InvalidUtf8IsTokenizedBytewiseAndRoundTrips) {
  auto tok = test::load_tiny(hello_spec());
  const std::string bad = "he\xff\xfe llo \xc3 caf\xc3\xa9 \xed\xa0\x80 \xf4\x90\x80\x80";
  auto ids = tok->encode(bad);
  EXPECT_EQ(tok->decode(ids), bad);
  EXPECT_EQ(tok->encode(bad), ids);  // deterministic
  tok::PretokScratch scratch;
  std::vector<tok::Span> spans;
  tok::split_pattern(tok::SplitPattern::kGpt2, "a\xff\xfe" "b", scratch, spans);
  ASSERT_EQ(spans.size(), 3u);  // each invalid byte is class "other": a | \xff\xfe | b
  EXPECT_EQ(spans[1].end - spans[1].begin, 2u);
}

TEST(Bpe, DecodeRejectsUnknownIds) {
  auto tok = test::load_tiny(hello_spec());
  std::vector<TokenId> ids{1, 99999};
  EXPECT_THROW(tok->decode(ids), ValueError);
  std::vector<TokenId> negative{-1};
  EXPECT_THROW(tok->decode(negative), ValueError);
}

TEST(Pretokenizer, Gpt2Rules) {
  auto split = [](tok::SplitPattern p, std::string_view text) {
    tok::PretokScratch scratch;
    std::vector<tok::Span> spans;
    tok::split_pattern(p, text, scratch, spans);
    Strings out;
    for (auto s : spans) out.emplace_back(text.substr(s.begin, s.end - s.begin));
    return out;
  };
  using P = tok::SplitPattern;
  EXPECT_EQ(split(P::kGpt2, "Hello world's  x\n\n 12345"),
            (Strings{"Hello", " world", "'s", " ", " x", "\n\n", " 12345"}));
  EXPECT_EQ(split(P::kGpt2, "I'M  "), (Strings{"I", "'", "M", "  "}));  // GPT-2 contractions are lower case
  EXPECT_EQ(split(P::kLlama3, "I'M 12345 \"quoted\"\n\nx"),
            (Strings{"I", "'M", " ", "123", "45", " \"", "quoted", "\"\n\n", "x"}));
  EXPECT_EQ(split(P::kQwen2, "x 123"), (Strings{"x", " ", "1", "2", "3"}));
  EXPECT_EQ(split(P::kLlama3, "a \n  b"), (Strings{"a", " \n", " ", " b"}));
}

TEST(StreamingDecoder, HoldsBackPartialCharacters) {
  auto tok = test::load_tiny(hello_spec());
  auto byte_id = [&](unsigned char b) { return *tok->token_to_id(tok::byte_level_encode(std::string(1, static_cast<char>(b)))); };
  StreamingDecoder dec(*tok);
  EXPECT_EQ(dec.push(byte_id('a')), "a");
  EXPECT_EQ(dec.push(byte_id(0xF0)), "");  // rocket: F0 9F 9A 80
  EXPECT_EQ(dec.push(byte_id(0x9F)), "");
  EXPECT_EQ(dec.push(byte_id(0x9A)), "");
  EXPECT_EQ(dec.push(byte_id(0x80)), "\xF0\x9F\x9A\x80");
  EXPECT_EQ(dec.push(byte_id(0xFF)), "\xEF\xBF\xBD");  // never a valid start: replaced at once
  EXPECT_EQ(dec.push(byte_id(0xC3)), "");
  EXPECT_EQ(dec.push(byte_id('x')), "\xEF\xBF\xBDx");  // the broken sequence, then x
  EXPECT_EQ(dec.push(byte_id(0xE2)), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

TEST(Unicode, ClassesAndNfc) {
  EXPECT_EQ(tok::cp_class('a'), tok::kLetter);
  EXPECT_EQ(tok::cp_class(0x4E00), tok::kLetter);
  EXPECT_EQ(tok::cp_class(0x2167), tok::kNumber);  // Roman numeral eight (Nl)
  EXPECT_EQ(tok::cp_class(0xA0), tok::kSpace);
  EXPECT_EQ(tok::cp_class(0x85), tok::kSpace);
  EXPECT_EQ(tok::cp_class('\n'), tok::kNewline);
  EXPECT_EQ(tok::cp_class(0x301), tok::kOther);  // combining mark
  EXPECT_EQ(tok::nfc("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(tok::nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul jamo compose
  EXPECT_EQ(tok::nfc("a\xFF" "e\xCC\x81"), "a\xFF\xC3\xA9");       // invalid bytes kept
}

}  // namespace
}  // namespace corelm
