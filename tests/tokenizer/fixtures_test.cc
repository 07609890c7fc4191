// Exactness on published vectors: llama.cpp's 47 vocab test strings for GPT-2, Llama 3, Qwen2 and
// Llama 2 (SentencePiece), and the tiktoken / llama2.c vectors in test_vectors.json.
#include <nlohmann/json.hpp>

#include "corelm/tokenizer.h"
#include "tokenizer/test_util.h"

namespace corelm {
namespace {

using test::tokenizers_dir;

struct VocabCase {
  std::string text;
  std::vector<TokenId> ids;
};

// The .inp file separates strings by "\n__ggml_vocab_test__\n"; the copies on disk use CRLF line
// ends, which are not part of the strings.
std::vector<VocabCase> read_llama_cpp_cases(const std::string& stem) {
  std::string inp = test::without_cr(test::slurp(stem + ".inp"));
  std::string out = test::without_cr(test::slurp(stem + ".out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (true) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  // The file ends with a separator, so the 47th string is the empty string (expected ids: none),
  // as llama.cpp's own test reads it.
  std::vector<VocabCase> cases;
  std::istringstream lines(out);
  std::string line;
  for (const std::string& t : texts) {
    std::getline(lines, line);
    VocabCase c{t, {}};
    std::istringstream ids(line);
    TokenId id;
    while (ids >> id) c.ids.push_back(id);
    cases.push_back(c);
  }
  return cases;
}

void expect_cases(const Tokenizer& tok, const std::vector<VocabCase>& cases, const char* name) {
  int matched = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<TokenId> got = tok.encode(cases[i].text);
    EXPECT_EQ(got, cases[i].ids) << name << " case " << i << ": '" << cases[i].text << "'";
    if (got == cases[i].ids) ++matched;
    EXPECT_EQ(tok.decode(got), cases[i].text) << name << " round trip, case " << i;
  }
  std::cout << "[ fixtures ] " << name << ": " << matched << "/" << cases.size() << " match\n";
}

TEST(Fixtures, Gpt2TokenizerJson) {
  std::string path = tokenizers_dir() + "/gpt2/tokenizer.json";
  CORELM_REQUIRE_FILE(path);
  auto cases = read_llama_cpp_cases(tokenizers_dir() + "/llama.cpp-vocab-tests/ggml-vocab-gpt-2.gguf");
  ASSERT_EQ(cases.size(), 47u);
  expect_cases(*Tokenizer::load(path), cases, "gpt2 tokenizer.json");
}

TEST(Fixtures, Gpt2VocabMerges) {
  std::string path = tokenizers_dir() + "/gpt2/vocab.json";
  CORELM_REQUIRE_FILE(path);
  auto cases = read_llama_cpp_cases(tokenizers_dir() + "/llama.cpp-vocab-tests/ggml-vocab-gpt-2.gguf");
  expect_cases(*Tokenizer::load(path), cases, "gpt2 vocab.json+merges.txt");
}

TEST(Fixtures, Llama3) {
  std::string path = tokenizers_dir() + "/llama3/tokenizer.json.zst";
  CORELM_REQUIRE_FILE(path);
  auto cases = read_llama_cpp_cases(tokenizers_dir() + "/llama.cpp-vocab-tests/ggml-vocab-llama-bpe.gguf");
  ASSERT_EQ(cases.size(), 47u);
  expect_cases(*Tokenizer::load(path), cases, "llama3");
}

TEST(Fixtures, Qwen2) {
  std::string path = tokenizers_dir() + "/qwen3/tokenizer.json.zst";
  CORELM_REQUIRE_FILE(path);
  auto cases = read_llama_cpp_cases(tokenizers_dir() + "/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf");
  ASSERT_EQ(cases.size(), 47u);
  expect_cases(*Tokenizer::load(path), cases, "qwen2 (qwen3 tokenizer.json)");
}

TEST(Fixtures, Llama2SentencePiece) {
  std::string path = tokenizers_dir() + "/llama2/tokenizer.model";
  CORELM_REQUIRE_FILE(path);
  auto cases = read_llama_cpp_cases(tokenizers_dir() + "/llama.cpp-vocab-tests/ggml-vocab-llama-spm.gguf");
  ASSERT_EQ(cases.size(), 47u);
  expect_cases(*Tokenizer::load(path), cases, "llama2 sentencepiece");
}

TEST(Fixtures, TestVectorsJson) {
  std::string path = tokenizers_dir() + "/test_vectors.json";
  CORELM_REQUIRE_FILE(path);
  auto doc = nlohmann::json::parse(test::slurp(path));
  struct Which {
    const char* key;
    std::string file;
  };
  for (const Which& w : {Which{"gpt2", tokenizers_dir() + "/gpt2/vocab.json"},
                         Which{"gpt2", tokenizers_dir() + "/gpt2/tokenizer.json"},
                         Which{"llama2", tokenizers_dir() + "/llama2/tokenizer.model"}}) {
    auto tok = Tokenizer::load(w.file);
    const auto& section = doc[w.key];
    EncodeOptions opt;
    opt.add_special = section.value("add_bos", false);
    opt.parse_special = true;  // the tiktoken vectors allow <|endoftext|>
    int matched = 0, total = 0;
    for (const auto& c : section["cases"]) {
      std::vector<TokenId> want = c["ids"].get<std::vector<TokenId>>();
      std::vector<TokenId> got = tok->encode(c["text"].get<std::string>(), opt);
      EXPECT_EQ(got, want) << w.file << ": '" << c["text"].get<std::string>() << "'";
      matched += got == want;
      ++total;
    }
    std::cout << "[ fixtures ] test_vectors.json " << w.key << " with " << w.file << ": " << matched << "/" << total
              << " match\n";
  }
}

}  // namespace
}  // namespace corelm
