// Differential tests: our ids must equal Hugging Face tokenizers, tiktoken and sentencepiece on
// thousands of random and corpus strings, with special tokens parsed and as plain text.
#include "corelm/tokenizer.h"
#include "tokenizer/oracle.h"
#include "tokenizer/random_text.h"
#include "tokenizer/test_util.h"
#include "tokenizer/tiny_tokenizer.h"

namespace corelm {
namespace {

std::vector<std::string> corpus_strings(size_t count, uint64_t seed) {
  std::vector<std::string> out;
  std::mt19937_64 rng(seed);
  for (const char* rel : {"/wikitext-2/wiki.test.raw", "/corpus/tinyshakespeare.txt", "/corpus/tinystories_valid_head.txt"}) {
    std::string text = test::slurp(test::shared_data() + rel);
    if (text.empty()) continue;
    for (size_t i = 0; i < count / 3; ++i) {  // random multi-line windows, cut at UTF-8 boundaries
      size_t start = rng() % text.size(), len = 1 + rng() % 600;
      while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t end = std::min(text.size(), start + len);
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
      out.push_back(text.substr(start, end - start));
    }
  }
  return out;
}

std::vector<std::string> test_strings(size_t random_count, uint64_t seed) {
  test::RandomText gen(seed);
  std::vector<std::string> texts;
  for (size_t i = 0; i < random_count; ++i) texts.push_back(gen.unicode());
  for (auto& s : corpus_strings(1500, seed + 1)) texts.push_back(std::move(s));
  return texts;
}

void compare(const Tokenizer& tok, const std::vector<std::string>& texts, const std::vector<nlohmann::json>& want,
             const char* name, bool check_plain) {
  ASSERT_EQ(want.size(), texts.size());
  int mismatches = 0;
  EncodeOptions parse, plain;
  parse.parse_special = true;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto got = tok.encode(texts[i], parse);
    auto expected = want[i]["ids"].get<std::vector<TokenId>>();
    if (got != expected && ++mismatches <= 5)
      ADD_FAILURE() << name << ": ids differ for " << nlohmann::json(texts[i]).dump() << "\n ours: "
                    << nlohmann::json(got).dump() << "\n reference: " << nlohmann::json(expected).dump();
    if (check_plain) {
      auto got_plain = tok.encode(texts[i], plain);
      auto expected_plain = want[i]["plain"].get<std::vector<TokenId>>();
      if (got_plain != expected_plain && ++mismatches <= 5)
        ADD_FAILURE() << name << ": plain-text ids differ for " << nlohmann::json(texts[i]).dump();
    }
    if (want[i].contains("decoded")) {
      std::string decoded = tok.decode(got);
      if (decoded != want[i]["decoded"].get<std::string>() && ++mismatches <= 5)
        ADD_FAILURE() << name << ": decode differs for " << nlohmann::json(texts[i]).dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::cout << "[ differential ] " << name << ": " << texts.size() - mismatches << "/" << texts.size()
            << " strings identical\n";
}

void run_hf(const std::string& file, const char* name, uint64_t seed) {
  CORELM_REQUIRE_FILE(file);
  auto texts = test_strings(2500, seed);
  std::string why;
  auto want = test::run_oracle("hf", "--tokenizer " + file, texts, &why);
  if (!want) GTEST_SKIP() << why;
  compare(*Tokenizer::load(file), texts, *want, name, true);
}

TEST(Differential, Gpt2VsHuggingFace) { run_hf(test::tokenizers_dir() + "/gpt2/tokenizer.json", "gpt2 vs HF tokenizers", 11); }
TEST(Differential, Llama3VsHuggingFace) {
  run_hf(test::tokenizers_dir() + "/llama3/tokenizer.json.zst", "llama3 vs HF tokenizers", 12);
}
TEST(Differential, Qwen2VsHuggingFace) {
  run_hf(test::tokenizers_dir() + "/qwen3/tokenizer.json.zst", "qwen2/3 vs HF tokenizers", 13);
}

TEST(Differential, Gpt2VsTiktoken) {
  std::string file = test::tokenizers_dir() + "/gpt2/vocab.json";
  CORELM_REQUIRE_FILE(file);
  auto texts = test_strings(2500, 14);
  std::string why;
  auto want = test::run_oracle("tiktoken", "--tokenizer " + file, texts, &why);
  if (!want) GTEST_SKIP() << why;
  compare(*Tokenizer::load(file), texts, *want, "gpt2 vs tiktoken", true);
}

TEST(Differential, Llama2VsSentencePiece) {
  std::string file = test::tokenizers_dir() + "/llama2/tokenizer.model";
  CORELM_REQUIRE_FILE(file);
  auto texts = test_strings(2500, 15);
  std::string why;
  auto want = test::run_oracle("spm", "--tokenizer " + file, texts, &why);
  if (!want) GTEST_SKIP() << why;
  compare(*Tokenizer::load(file), texts, *want, "llama2 vs sentencepiece", false);
}

}  // namespace
}  // namespace corelm

namespace corelm {
namespace {

// The general pre-tokenizer pipeline (SmolLM: Digits then ByteLevel; GPT-2 variants with
// add_prefix_space) on a tokenizer built here, against HF on the same file.
TEST(Differential, PipelinesVsHuggingFace) {
  test::TinySpec base;
  base.merges = {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"e", "r"}, {"1", "2"}, {"12", "3"}, {" ", "1"}, {"i", "n"}, {" ", "in"}};
  base.added_tokens = {{{"id", 256 + 9}, {"content", "<|endoftext|>"}, {"special", true}, {"single_word", false},
                        {"lstrip", false}, {"rstrip", false}, {"normalized", false}}};
  struct Variant {
    const char* name;
    nlohmann::json pre;
  };
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const std::vector<Variant> variants = {
      {"smollm digits+bytelevel",
       {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}}},
      {"digit runs+bytelevel",
       {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", false}}, byte_level}}}},
      {"bytelevel add_prefix_space",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
  };
  test::RandomText gen(31);
  std::vector<std::string> texts;
  for (int i = 0; i < 600; ++i) texts.push_back(gen.unicode());
  for (const auto& v : variants) {
    test::TinySpec spec = base;
    spec.pre_tokenizer = v.pre;
    std::string path = test::write_temp("tokenizer.json", test::tiny_json(spec).dump());
    std::string why;
    auto want = test::run_oracle("hf", "--tokenizer " + path, texts, &why);
    if (!want) GTEST_SKIP() << why;
    compare(*Tokenizer::load(path), texts, *want, v.name, true);
  }
}

}  // namespace
}  // namespace corelm
