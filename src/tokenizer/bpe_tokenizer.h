// Byte-level BPE tokenizer: added-token matching, normalization, the pre-tokenizer pipeline and the
// BPE model, configured by a BpeSpec that the tokenizer.json / vocab.json loaders fill in.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/pretokenizer.h"

namespace corelm::tok {

struct PreTokStage {
  enum Kind { kSplit, kByteLevel, kDigits } kind = kByteLevel;
  SplitPattern pattern = SplitPattern::kGpt2;  // kSplit, and kByteLevel with use_regex
  bool use_regex = true;                       // kByteLevel
  bool add_prefix_space = false;               // kByteLevel
  bool individual_digits = false;              // kDigits
};

struct BpeSpec {
  std::string source;               // file name, for messages
  std::vector<std::string> tokens;  // model vocabulary: bytes of each id
  std::vector<BpeModel::MergeRule> merges;
  bool ignore_merges = false;
  // model.unk_token's id (-1: none) and model.fuse_unk: what a byte without a single-byte token
  // becomes (see BpeModel). GGUF vocabularies never set it: llama.cpp drops such bytes.
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool nfc = false;
  std::vector<PreTokStage> stages;
  std::vector<AddedToken> added;
  std::vector<int32_t> prefix, suffix;  // post-processor template (BOS..., ...EOS)
  // From tokenizer_config.json / special_tokens_map.json when present.
  std::optional<std::string> bos_token, eos_token, pad_token;
  std::optional<bool> add_bos, add_eos;
};

// Parses a Hugging Face tokenizer.json document. Throws FormatError naming source and field for
// anything it does not implement exactly.
BpeSpec parse_hf_tokenizer_json(const nlohmann::json& doc, const std::string& source);
// The classic GPT-2 pair.
BpeSpec parse_vocab_merges(const std::string& vocab_path, const std::string& merges_path);
// Applies tokenizer_config.json (bos/eos/pad tokens, add_bos_token/add_eos_token) if it exists.
void apply_tokenizer_config(BpeSpec& spec, const std::string& config_path);

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec);

// Writes a spec as a Hugging Face tokenizer.json document (the trainer's output format).
std::string to_hf_tokenizer_json(const BpeSpec& spec);  // JSON text

}  // namespace corelm::tok
