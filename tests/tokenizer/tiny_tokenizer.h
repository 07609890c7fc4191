// Builds small byte-level tokenizer.json documents inside the tests, so the unit tests need no
// downloaded files.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/oracle.h"

namespace corelm::test {

struct TinySpec {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, in rank order
  std::vector<std::string> extra_tokens;                    // vocabulary entries no merge makes
  nlohmann::json added_tokens = nlohmann::json::array();
  nlohmann::json pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  nlohmann::json post_processor = nullptr;
  nlohmann::json normalizer = nullptr;
  bool ignore_merges = false;
  std::vector<int> missing_bytes;     // bytes left without a single-byte token (as in real vocabularies)
  nlohmann::json unk_token = nullptr;  // model.unk_token
  bool fuse_unk = false;
};

inline nlohmann::json tiny_json(const TinySpec& s) {
  using tok::byte_level_encode;
  nlohmann::json vocab = nlohmann::json::object();
  int next = 0;
  auto add = [&](const std::string& bytes) {
    std::string key = byte_level_encode(bytes);
    if (!vocab.contains(key)) vocab[key] = next++;
  };
  for (int b = 0; b < 256; ++b)
    if (std::find(s.missing_bytes.begin(), s.missing_bytes.end(), b) == s.missing_bytes.end())
      add(std::string(1, static_cast<char>(b)));
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : s.merges) {
    add(a + b);
    merges.push_back(byte_level_encode(a) + " " + byte_level_encode(b));
  }
  for (const auto& t : s.extra_tokens) add(t);
  return {{"version", "1.0"},
          {"added_tokens", s.added_tokens},
          {"normalizer", s.normalizer},
          {"pre_tokenizer", s.pre_tokenizer},
          {"post_processor", s.post_processor},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", s.unk_token},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", s.fuse_unk},
            {"byte_fallback", false},
            {"ignore_merges", s.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// Writes `doc` (or raw text) to a fresh temp file and returns its path.
inline std::string write_temp(const std::string& name, const std::string& text) {
  auto dir = fresh_temp_dir("tiny");
  auto path = dir / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

inline std::unique_ptr<Tokenizer> load_tiny(const TinySpec& s) {
  return Tokenizer::load(write_temp("tokenizer.json", tiny_json(s).dump()));
}

// The ids as the byte strings they stand for (readable expectations without magic numbers).
inline std::vector<std::string> pieces(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  std::vector<std::string> out;
  for (TokenId id : ids) out.emplace_back(tok.token_bytes(id));
  return out;
}

}  // namespace corelm::test
