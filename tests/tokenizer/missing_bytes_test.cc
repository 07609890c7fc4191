// Byte-level BPE vocabularies that lack some single-byte tokens, as real ones do (SmolLM2's has
// no token for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF): they load,
// and encode exactly as Hugging Face tokenizers does on the same tokenizer.json — such a byte is
// dropped before merging (its neighbours may then merge), or becomes model.unk_token when the
// file names one (one per byte, or one per run with fuse_unk). The GGUF form of the vocabulary
// behaves the same.
#include <random>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "tokenizer/oracle.h"
#include "tokenizer/random_text.h"
#include "tokenizer/test_util.h"
#include "tokenizer/tiny_tokenizer.h"

namespace corelm {
namespace {

// The single-byte tokens SmolLM2-135M's vocabulary lacks (read from its GGUF).
const std::vector<int> kSmolMissing = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5,
                                       0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF};

std::string drop_missing(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::find(kSmolMissing.begin(), kSmolMissing.end(), static_cast<unsigned char>(c)) == kSmolMissing.end())
      out.push_back(c);
  return out;
}

// Merges that cross a dropped byte ("a\x04b" -> "ab"), inside one pre-token with and without
// the GPT-2 regex, plus a token holding a missing byte that no merge can build.
test::TinySpec tiny_missing(bool use_regex) {
  test::TinySpec s;
  s.merges = {{"a", "b"}, {"ab", "c"}, {"!", "!"}, {" ", "a"}, {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
              {"\x90", "\x80"}};
  s.extra_tokens = {"\x04" "b", "<unk>"};
  s.missing_bytes = kSmolMissing;
  s.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
  return s;
}

// Strings full of the missing bytes that HF can take (valid UTF-8: the control characters, and
// U+40000..U+BFFFF whose lead byte is 0xF1 or 0xF2).
std::vector<std::string> texts_with_missing_bytes(size_t random_count, uint64_t seed) {
  std::vector<std::string> texts = {"a\x04" "b", "a\x04" "bc", "\x04" "ab", "ab\x04", "\x04", "\x04\x06\x13\x14\x16\x1d",
                                    "\x04" "b", "x\x04\x04y", "!\x04!", "he\x04ll\x13o", "hel\x16lo world\x1d!",
                                    " \x04" "a", "\xF1\x90\x80\x80", "a\xF2\x80\x80\x80" "b", "hello \xF1\xBF\xBF\xBF!!"};
  test::RandomText gen(seed);
  std::mt19937_64& rng = gen.rng();
  const char* controls[] = {"\x04", "\x06", "\x13", "\x14", "\x16", "\x1d", "\xF1\x90\x80\x80", "\xF2\xA0\x80\x81"};
  for (size_t i = 0; i < random_count; ++i) {
    std::string s = gen.unicode(16);
    // Insert a few missing-byte characters at character boundaries.
    for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) {
      size_t at = rng() % (s.size() + 1);
      while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
      s.insert(at, controls[rng() % std::size(controls)]);
    }
    texts.push_back(std::move(s));
  }
  return texts;
}

void compare_with_hf(const Tokenizer& tok, const std::string& file, const std::vector<std::string>& texts,
                     const char* name) {
  std::string why;
  auto want = test::run_oracle("hf", "--tokenizer " + file, texts, &why);
  if (!want) GTEST_SKIP() << why;
  ASSERT_EQ(want->size(), texts.size());
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    EncodeOptions parse;
    parse.parse_special = true;  // the oracle's "ids" parse special-token text
    const auto got = tok.encode(texts[i], parse);
    const auto expected = (*want)[i]["ids"].get<std::vector<TokenId>>();
    if (got != expected && ++mismatches <= 5)
      ADD_FAILURE() << name << ": ids differ for " << nlohmann::json(texts[i]).dump() << "\n ours: "
                    << nlohmann::json(got).dump() << "\n reference: " << nlohmann::json(expected).dump();
    // HF decodes to a Rust String (invalid UTF-8 replaced by U+FFFD, as the streaming decoder does):
    // dropping a lead byte such as 0xF1 leaves continuation bytes behind.
    StreamingDecoder d(tok, /*skip_special=*/false);
    std::string decoded;
    for (TokenId id : got) decoded += d.push(id);
    decoded += d.flush();
    if (decoded != (*want)[i]["decoded"].get<std::string>() && ++mismatches <= 5)
      ADD_FAILURE() << name << ": decode differs for " << nlohmann::json(texts[i]).dump();
  }
  EXPECT_EQ(mismatches, 0);
  std::cout << "[ missing bytes ] " << name << ": " << texts.size() - mismatches << "/" << texts.size()
            << " strings identical to HF tokenizers\n";
}

TEST(MissingByteTokens, TinyVocabularyLoadsAndDropsThemBeforeMerging) {
  for (bool regex : {false, true}) {
    auto tok = test::load_tiny(tiny_missing(regex));
    // Within one pre-token "a\x04bc" is "abc": the dropped byte does not stop the merges (HF
    // tokenizers does the same). The GPT-2 regex makes "\x04" a pre-token of its own.
    EXPECT_EQ(test::pieces(*tok, tok->encode("a\x04" "bc")),
              regex ? (std::vector<std::string>{"a", "b", "c"}) : (std::vector<std::string>{"abc"}));
    EXPECT_TRUE(tok->encode("\x04\xFF\xC0").empty());
    EXPECT_EQ(tok->decode(tok->encode("he\x04llo")), "hello");
  }
}

TEST(MissingByteTokens, TinyVocabularyMatchesHuggingFace) {
  const auto texts = texts_with_missing_bytes(400, 31);
  for (bool regex : {false, true}) {
    const std::string file = test::write_temp("tokenizer.json", test::tiny_json(tiny_missing(regex)).dump());
    compare_with_hf(*Tokenizer::load(file), file, texts, regex ? "tiny, GPT-2 regex" : "tiny, no regex");
  }
}

TEST(MissingByteTokens, UnknownTokenStandsForThemAsInHuggingFace) {
  const auto texts = texts_with_missing_bytes(300, 32);
  for (bool fuse : {false, true}) {
    test::TinySpec s = tiny_missing(false);
    s.unk_token = "<unk>";
    s.fuse_unk = fuse;
    const std::string file = test::write_temp("tokenizer.json", test::tiny_json(s).dump());
    auto tok = Tokenizer::load(file);
    const auto unk = tok->token_to_id("<unk>");
    ASSERT_TRUE(unk.has_value());
    const auto ids = tok->encode("x\x04\x06y\xFF");
    EXPECT_EQ(std::count(ids.begin(), ids.end(), *unk), fuse ? 2 : 3);
    compare_with_hf(*tok, file, texts, fuse ? "tiny, unk_token, fuse_unk" : "tiny, unk_token");
  }
  // An unk_token that is not in the vocabulary cannot stand for anything: named at load.
  test::TinySpec bad = tiny_missing(false);
  bad.unk_token = "<nope>";
  try {
    test::load_tiny(bad);
    ADD_FAILURE() << "loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("model.unk_token '<nope>'"), std::string::npos) << e.what();
  }
}

// Bytes no Python string can hold (0xC0, 0xC1, 0xF5..0xFF never occur in UTF-8): dropped the
// same way, so decode(encode(x)) is x without them.
TEST(MissingByteTokens, ArbitraryBytesRoundTripWithoutTheMissingOnes) {
  auto tok = test::load_tiny(tiny_missing(true));
  test::RandomText gen(33);
  for (int i = 0; i < 3000; ++i) {
    const std::string s = gen.bytes(80);
    ASSERT_EQ(tok->decode(tok->encode(s)), drop_missing(s)) << ::testing::PrintToString(s);
  }
}

// GPT-2's real 50257-token vocabulary with SmolLM2's 21 byte tokens (and the merges that use
// them) removed, against HF tokenizers on the same file.
TEST(MissingByteTokens, Gpt2WithoutSmolLM2ByteTokensMatchesHuggingFace) {
  const std::string src = test::tokenizers_dir() + "/gpt2/tokenizer.json";
  CORELM_REQUIRE_FILE(src);
  nlohmann::json doc = nlohmann::json::parse(test::slurp(src));
  std::vector<std::string> gone;
  for (int b : kSmolMissing) gone.push_back(tok::byte_level_encode(std::string(1, static_cast<char>(b))));
  auto& vocab = doc["model"]["vocab"];
  for (const auto& g : gone) vocab.erase(g);
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : doc["model"]["merges"]) {
    const std::string s = m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>();
    const std::string left = s.substr(0, s.find(' ')), right = s.substr(s.find(' ') + 1);
    if (std::find(gone.begin(), gone.end(), left) == gone.end() && std::find(gone.begin(), gone.end(), right) == gone.end())
      merges.push_back(s);
  }
  doc["model"]["merges"] = merges;
  const std::string file = test::write_temp("tokenizer.json", doc.dump());
  auto tok = Tokenizer::load(file);
  compare_with_hf(*tok, file, texts_with_missing_bytes(1500, 34), "gpt2 without SmolLM2's byte tokens");
}

// The GGUF "gpt2" form of such a vocabulary (what llama.cpp files hold) tokenizes the same, and
// converts back to a tokenizer.json.
TEST(MissingByteTokens, GgufVocabularyEncodesLikeTheTokenizerJson) {
  const std::string file = test::write_temp("tokenizer.json", test::tiny_json(tiny_missing(true)).dump());
  auto ref = Tokenizer::load(file);
  GgufBpeVocab v = gguf_bpe_vocab_from_file(file);
  auto tok = tokenizer_from_gguf_bpe(v, "tiny.gguf");
  for (const auto& s : texts_with_missing_bytes(300, 35)) EXPECT_EQ(tok->encode(s), ref->encode(s)) << s;
  EXPECT_NO_THROW(gguf_bpe_vocab_to_tokenizer_json(v, "tiny.gguf"));
}

// SmolLM2's GGUF layout: its control tokens are ids 0..16, before the byte tokens, and its
// vocabulary lacks 21 byte tokens. `convert --to hf` writes such a vocabulary as a tokenizer.json
// with the control tokens also in model.vocab (as HF's own files have them); it loads in ours
// and in HF tokenizers and encodes like the GGUF.
TEST(MissingByteTokens, SmolLM2LayoutConvertsToTokenizerJson) {
  const std::string file = test::write_temp("tokenizer.json", test::tiny_json(tiny_missing(true)).dump());
  GgufBpeVocab v = gguf_bpe_vocab_from_file(file);
  v.tokens.insert(v.tokens.begin(), {"<|endoftext|>", "<|im_start|>"});
  v.token_types.insert(v.token_types.begin(), {3, 3});
  v.eos = 0;
  auto from_gguf = tokenizer_from_gguf_bpe(v, "smol.gguf");
  const std::string converted = test::write_temp("tokenizer.json", gguf_bpe_vocab_to_tokenizer_json(v, "smol.gguf"));
  auto tok = Tokenizer::load(converted);
  auto texts = texts_with_missing_bytes(200, 36);
  texts.push_back("<|im_start|>user\x04 hi<|endoftext|>");
  EncodeOptions parse;
  parse.parse_special = true;
  for (const auto& t : texts) EXPECT_EQ(tok->encode(t, parse), from_gguf->encode(t, parse)) << t;
  EXPECT_EQ(tok->encode("<|im_start|>", parse), (std::vector<TokenId>{1}));
  compare_with_hf(*tok, converted, texts, "SmolLM2-layout GGUF converted to tokenizer.json");
}

}  // namespace
}  // namespace corelm
