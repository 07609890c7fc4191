// Byte-level BPE vocabularies <-> llama.cpp's GGUF "gpt2" tokenizer form (see tokenizer.h).
// llama.cpp names its pre-tokenizers instead of storing the pipeline; the mapping to our stages:
//   gpt-2     ByteLevel(use_regex) with the GPT-2 pattern (or Split(GPT-2) + ByteLevel)
//   llama-bpe Split(Llama-3 pattern) + ByteLevel(no regex)
//   qwen2     Split(Qwen2 pattern) + ByteLevel(no regex)
//   smollm    Digits(individual) + ByteLevel(use_regex)
#include <filesystem>
#include <unordered_map>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "corelm/utf8.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/file_io.h"

namespace corelm {
namespace {

using tok::PreTokStage;
using tok::SplitPattern;

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

bool is_byte_level(const PreTokStage& s, bool regex) {
  return s.kind == PreTokStage::kByteLevel && s.use_regex == regex && !s.add_prefix_space &&
         (!regex || s.pattern == SplitPattern::kGpt2);
}
bool is_split(const PreTokStage& s, SplitPattern p) { return s.kind == PreTokStage::kSplit && s.pattern == p; }

std::string pre_name(const std::vector<PreTokStage>& st, const std::string& source) {
  if (st.size() == 1 && is_byte_level(st[0], true)) return "gpt-2";
  if (st.size() == 2 && is_byte_level(st[1], false)) {
    if (is_split(st[0], SplitPattern::kGpt2)) return "gpt-2";
    if (is_split(st[0], SplitPattern::kLlama3)) return "llama-bpe";
    if (is_split(st[0], SplitPattern::kQwen2)) return "qwen2";
  }
  if (st.size() == 2 && st[0].kind == PreTokStage::kDigits && st[0].individual_digits && is_byte_level(st[1], true))
    return "smollm";
  throw FormatError(source + ": pre_tokenizer has no llama.cpp equivalent (supported: GPT-2 ByteLevel, "
                             "Llama-3 or Qwen2 Split + ByteLevel, Digits + ByteLevel)");
}

std::vector<PreTokStage> stages_of(const std::string& pre, const std::string& source) {
  PreTokStage byte_level;  // kByteLevel, GPT-2 regex
  PreTokStage plain_bytes;
  plain_bytes.use_regex = false;
  PreTokStage split;
  split.kind = PreTokStage::kSplit;
  if (pre == "gpt-2" || pre == "default") return {byte_level};
  if (pre == "llama-bpe" || pre == "llama3") {
    split.pattern = SplitPattern::kLlama3;
    return {split, plain_bytes};
  }
  if (pre == "qwen2") {
    split.pattern = SplitPattern::kQwen2;
    return {split, plain_bytes};
  }
  if (pre == "smollm") {
    PreTokStage digits;
    digits.kind = PreTokStage::kDigits;
    digits.individual_digits = true;
    return {digits, byte_level};
  }
  throw FormatError(source + ": tokenizer.ggml.pre '" + pre +
                    "' is not supported (supported: gpt-2, default, llama-bpe, llama3, qwen2, smollm)");
}

tok::BpeSpec read_spec(const std::string& path) {
  namespace fs = std::filesystem;
  if (tok::is_directory(path)) {
    for (const char* name : {"tokenizer.json", "vocab.json"}) {
      const std::string candidate = (fs::path(path) / name).string();
      if (tok::file_exists(candidate)) return read_spec(candidate);
    }
    throw IOError(path + ": directory holds no tokenizer.json or vocab.json (byte-level BPE)");
  }
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  tok::BpeSpec spec;
  if (path.ends_with("vocab.json")) {
    spec = tok::parse_vocab_merges(path, dir + "/merges.txt");
  } else {
    CORELM_CHECK(path.ends_with(".json") || path.ends_with(".json.zst"), FormatError, path,
                 ": only byte-level BPE tokenizers (tokenizer.json, vocab.json) can be stored as a GGUF gpt2 vocabulary");
    try {
      spec = tok::parse_hf_tokenizer_json(nlohmann::json::parse(tok::read_file(path)), path);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(path + ": invalid tokenizer JSON: " + e.what());
    }
  }
  tok::apply_tokenizer_config(spec, dir + "/tokenizer_config.json");
  return spec;
}

// The spec a GGUF vocabulary describes: normal tokens form the model vocabulary, control and
// user-defined ones become added tokens, unused ones (padding) are left out.
tok::BpeSpec spec_from_vocab(const GgufBpeVocab& v, const std::string& source) {
  CORELM_CHECK(v.token_types.empty() || v.token_types.size() == v.tokens.size(), FormatError, source,
               ": tokenizer.ggml.token_type has ", v.token_types.size(), " entries for ", v.tokens.size(), " tokens");
  tok::BpeSpec spec;
  spec.source = source;
  spec.stages = stages_of(v.pre.empty() ? "gpt-2" : v.pre, source);
  spec.nfc = v.nfc;
  spec.ignore_merges = v.ignore_merges;
  std::vector<std::string> spelled;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const int32_t type = v.token_types.empty() ? kNormal : v.token_types[id];
    const std::string& text = v.tokens[id];
    if (type == kNormal || type == kByte) {
      std::optional<std::string> bytes = tok::byte_level_decode(text);
      CORELM_CHECK(bytes.has_value() && !bytes->empty(), FormatError, source, ": tokenizer.ggml.tokens[", id, "] ('",
                   escape_invalid_utf8(text), "') is not a byte-level BPE token");
      spec.tokens.resize(id + 1);
      spelled.resize(id + 1);
      spec.tokens[id] = std::move(*bytes);
      spelled[id] = text;
    } else if (type != kUnused) {
      CORELM_CHECK(!text.empty(), FormatError, source, ": tokenizer.ggml.tokens[", id, "] is empty");
      spec.added.push_back({static_cast<int32_t>(id), text, type != kUserDefined, false, false});
    }
  }
  std::unordered_map<std::string, int32_t> index;
  for (size_t id = 0; id < spelled.size(); ++id)
    if (!spelled[id].empty()) index.emplace(spelled[id], static_cast<int32_t>(id));
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t space = m.find(' ');
    CORELM_CHECK(space != std::string::npos && space > 0 && space + 1 < m.size(), FormatError, source,
                 ": tokenizer.ggml.merges[", r, "] ('", escape_invalid_utf8(m), "') is not two tokens separated by a space");
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    auto find = [&](const std::string& s) {
      auto it = index.find(s);
      CORELM_CHECK(it != index.end(), FormatError, source, ": tokenizer.ggml.merges[", r, "] ('",
                   escape_invalid_utf8(m), "') uses '", escape_invalid_utf8(s), "', which is not a normal token");
      return it->second;
    };
    spec.merges.push_back({find(left), find(right), find(left + right)});
  }
  auto text_of = [&](const std::optional<TokenId>& id, const char* key) -> std::optional<std::string> {
    if (!id) return std::nullopt;
    CORELM_CHECK(*id >= 0 && static_cast<size_t>(*id) < v.tokens.size(), FormatError, source, ": tokenizer.ggml.",
                 key, " ", *id, " is outside the ", v.tokens.size(), " tokens");
    const int32_t type = v.token_types.empty() ? kNormal : v.token_types[*id];
    return type == kNormal || type == kByte ? *tok::byte_level_decode(v.tokens[*id]) : v.tokens[*id];
  };
  spec.bos_token = text_of(v.bos, "bos_token_id");
  spec.eos_token = text_of(v.eos, "eos_token_id");
  spec.pad_token = text_of(v.pad, "padding_token_id");
  spec.add_bos = v.add_bos;
  spec.add_eos = v.add_eos;
  return spec;
}

}  // namespace

GgufBpeVocab gguf_bpe_vocab_from_file(const std::string& tokenizer_path, size_t vocab_size) {
  tok::BpeSpec spec = read_spec(tokenizer_path);
  GgufBpeVocab v;
  v.pre = pre_name(spec.stages, spec.source);
  v.nfc = spec.nfc;
  v.ignore_merges = spec.ignore_merges;
  std::unique_ptr<Tokenizer> t = tok::make_bpe_tokenizer(spec);  // resolves bos/eos/pad like a load does
  const size_t n = std::max(vocab_size, t->vocab_size());
  v.tokens.resize(n);
  v.token_types.assign(n, kUnused);
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (spec.tokens[id].empty()) continue;
    v.tokens[id] = tok::byte_level_encode(spec.tokens[id]);
    v.token_types[id] = kNormal;
  }
  for (const tok::AddedToken& a : spec.added) {
    v.tokens[a.id] = a.content;
    v.token_types[a.id] = a.special ? kControl : kUserDefined;
  }
  for (size_t id = 0; id < n; ++id)
    if (v.token_types[id] == kUnused) v.tokens[id] = "[PAD" + std::to_string(id) + "]";
  for (const auto& m : spec.merges) v.merges.push_back(v.tokens[m.left] + " " + v.tokens[m.right]);
  v.bos = t->bos_id();
  v.eos = t->eos_id();
  v.pad = t->pad_id();
  v.add_bos = !t->special_prefix().empty() && t->bos_id() && t->special_prefix().front() == *t->bos_id();
  v.add_eos = !t->special_suffix().empty() && t->eos_id() && t->special_suffix().back() == *t->eos_id();
  return v;
}

std::unique_ptr<Tokenizer> tokenizer_from_gguf_bpe(const GgufBpeVocab& vocab, const std::string& source) {
  return tok::make_bpe_tokenizer(spec_from_vocab(vocab, source));
}

std::string gguf_bpe_vocab_to_tokenizer_json(const GgufBpeVocab& vocab, const std::string& source) {
  tok::BpeSpec spec = spec_from_vocab(vocab, source);
  // tokenizer.json lists the model vocabulary densely; added tokens must follow it without gaps.
  // Control tokens inside it (SmolLM2's <|endoftext|> .. <empty_output> are ids 0..16) are also
  // vocabulary entries in Hugging Face's own files; that works when the byte-level spelling of
  // the text is the text itself (ASCII), so HF maps the added token onto that entry on load.
  for (const tok::AddedToken& a : spec.added)
    if (static_cast<size_t>(a.id) < spec.tokens.size() && spec.tokens[a.id].empty() && !a.content.empty() &&
        tok::byte_level_encode(a.content) == a.content)
      spec.tokens[a.id] = a.content;
  for (size_t id = 0; id < spec.tokens.size(); ++id)
    CORELM_CHECK(!spec.tokens[id].empty(), FormatError, source, ": token ", id,
                 " is not a normal token but lies inside the vocabulary; tokenizer.json cannot express that");
  // Added tokens are stored verbatim, and GGUF strings are bytes: a JSON document can only hold
  // them when they are UTF-8 (normal tokens are spelled byte-level, always valid).
  for (const tok::AddedToken& a : spec.added) {
    const size_t bad = first_invalid_utf8(a.content);
    CORELM_CHECK(bad == std::string::npos, FormatError, source, ": tokenizer.ggml.tokens[", a.id, "] ('",
                 escape_invalid_utf8(a.content), "') is not valid UTF-8 (byte offset ", bad,
                 "), which a tokenizer.json cannot hold");
  }
  return tok::to_hf_tokenizer_json(spec);
}

}  // namespace corelm
