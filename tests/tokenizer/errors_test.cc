// Bad input must fail with an error that names the file and the field at fault, never with a
// crash or a silently different tokenization.
#include <gtest/gtest.h>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "tokenizer/tiny_tokenizer.h"

namespace corelm {
namespace {

// Expects Tokenizer::load(path) to throw E with every fragment in its message.
template <typename E>
void expect_load_error(const std::string& path, std::vector<std::string> fragments) {
  try {
    Tokenizer::load(path);
    ADD_FAILURE() << "loading " << path << " did not throw";
  } catch (const E& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

std::string with(const std::function<void(nlohmann::json&)>& edit) {
  test::TinySpec s;
  s.merges = {{"a", "b"}};
  nlohmann::json doc = test::tiny_json(s);
  edit(doc);
  return test::write_temp("tokenizer.json", doc.dump());
}

TEST(TokenizerErrors, CorruptJson) {
  expect_load_error<FormatError>(test::write_temp("tokenizer.json", "{\"model\": [1, 2"), {"tokenizer.json", "invalid JSON"});
}

TEST(TokenizerErrors, MissingOrWrongModel) {
  expect_load_error<FormatError>(with([](auto& d) { d.erase("model"); }), {"'model'"});
  expect_load_error<FormatError>(with([](auto& d) { d["model"]["type"] = "Unigram"; }), {"model.type", "Unigram"});
  expect_load_error<FormatError>(with([](auto& d) { d["model"].erase("merges"); }), {"model.merges"});
  expect_load_error<FormatError>(with([](auto& d) { d["model"]["dropout"] = 0.1; }), {"model.dropout"});
  expect_load_error<FormatError>(with([](auto& d) { d["model"]["byte_fallback"] = true; }), {"model.byte_fallback"});
  expect_load_error<FormatError>(with([](auto& d) { d["model"]["vocab"] = 5; }), {"model.vocab"});
}

TEST(TokenizerErrors, MergesThatDoNotFitTheVocabulary) {
  expect_load_error<FormatError>(with([](auto& d) { d["model"]["merges"].push_back("zz q"); }), {"model.merges[1]", "'zz'"});
  expect_load_error<FormatError>(with([](auto& d) { d["model"]["merges"].push_back("abc"); }), {"model.merges[1]"});
}

// A vocabulary without some byte tokens loads (real ones lack a few; see missing_bytes_test.cc),
// unless it names an unknown token it does not hold: then that byte could not be encoded.
TEST(TokenizerErrors, VocabularyWithoutAllBytes) {
  EXPECT_NO_THROW(Tokenizer::load(with([](auto& d) {
    d["model"]["vocab"].erase(tok::byte_level_encode("\x7f"));
  })));
  expect_load_error<FormatError>(with([](auto& d) {
                                   d["model"]["vocab"].erase(tok::byte_level_encode("\x7f"));
                                   d["model"]["unk_token"] = "<unk>";
                                 }),
                                 {"model.unk_token '<unk>'", "byte 127"});
}

TEST(TokenizerErrors, UnsupportedPipelineParts) {
  expect_load_error<FormatError>(with([](auto& d) { d["pre_tokenizer"] = {{"type", "Metaspace"}}; }),
                                 {"pre_tokenizer.type", "Metaspace"});
  expect_load_error<FormatError>(
      with([](auto& d) {
        d["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}},
                                                 {{"type", "ByteLevel"}, {"use_regex", false}}}}};
      }),
      {"pre_tokenizer.pretokenizers[0].pattern.Regex", "\\w+"});
  expect_load_error<FormatError>(with([](auto& d) { d["pre_tokenizer"] = nullptr; }), {"pre_tokenizer"});
  expect_load_error<FormatError>(with([](auto& d) { d["normalizer"] = {{"type", "Lowercase"}}; }),
                                 {"normalizer.type", "Lowercase"});
  expect_load_error<FormatError>(with([](auto& d) { d["decoder"] = {{"type", "WordPiece"}}; }), {"decoder.type"});
  expect_load_error<FormatError>(
      with([](auto& d) { d["added_tokens"] = {{{"id", 257}, {"content", "<x>"}, {"single_word", true}}}; }),
      {"added_tokens[0].single_word"});
  expect_load_error<FormatError>(with([](auto& d) { d["model"]["ignore_merges"] = "yes"; }), {"tokenizer.json"});
  // HF would number this token 257 (right after the vocabulary), so id 300 cannot be honoured.
  expect_load_error<FormatError>(
      with([](auto& d) { d["added_tokens"] = {{{"id", 300}, {"content", "<x>"}, {"special", true}}}; }),
      {"added_tokens[0].id", "257"});
}

TEST(TokenizerErrors, FilesAndPaths) {
  expect_load_error<IOError>("/nonexistent/tokenizer.json", {"/nonexistent/tokenizer.json"});
  std::string vocab = test::write_temp("vocab.json", "{}");
  expect_load_error<IOError>(vocab, {"merges.txt"});
  expect_load_error<FormatError>(test::write_temp("tokenizer.json.zst", "not zstd at all"), {"zstd"});
  expect_load_error<FormatError>(test::write_temp("tokenizer.model", "not a sentencepiece model"), {"tokenizer.model"});
  expect_load_error<ValueError>(test::write_temp("weights.bin", "x"), {"unknown tokenizer file type"});
  auto empty_dir = test::fresh_temp_dir("empty");
  expect_load_error<IOError>(empty_dir.string(), {"no tokenizer.json"});
}

TEST(TokenizerErrors, BadMergesTxt) {
  auto dir = test::fresh_temp_dir("pair");
  test::TinySpec s;
  nlohmann::json doc = test::tiny_json(s);
  std::ofstream(dir / "vocab.json") << doc["model"]["vocab"].dump();
  std::ofstream(dir / "merges.txt") << "#version: 0.2\na b c\n";
  expect_load_error<FormatError>((dir / "vocab.json").string(), {"merges.txt", "line 2"});
}

}  // namespace
}  // namespace corelm
