// Tokenizers: byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM and our own trained files) loaded from a
// Hugging Face tokenizer.json or a vocab.json + merges.txt pair, and SentencePiece .model files.
// encode() is exact with respect to the reference libraries; decode() returns the raw bytes the ids
// stand for, so decode(encode(x)) == x for any byte string x (see docs/TOKENIZER.md for the
// invalid-UTF-8 policy). All methods are const and safe to call from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace corelm {

using TokenId = int32_t;

struct EncodeOptions {
  // Add BOS/EOS the way the tokenizer's configuration says (post_processor template,
  // tokenizer_config.json add_bos_token/add_eos_token, or SentencePiece's Llama convention).
  bool add_special = false;
  // Recognise special-token text such as "<|endoftext|>" in the input. Off by default: corpus and
  // user text is then tokenized as plain text, so nobody can inject control tokens. Non-special
  // added tokens are always matched (as Hugging Face does).
  bool parse_special = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads a tokenizer.json (optionally .zst-compressed), a vocab.json (merges.txt beside it), a
  // SentencePiece .model, or a model directory holding one of those. Throws IOError/FormatError
  // naming the file and field for anything missing, malformed or unsupported.
  static std::unique_ptr<Tokenizer> load(const std::string& path);

  virtual std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const = 0;
  // Appends to `out` (no allocation per call once `out` has grown): the corpus path uses this.
  virtual void encode_append(std::string_view text, const EncodeOptions& options, std::vector<TokenId>& out) const = 0;

  // Raw bytes of the ids, concatenated. Special tokens are skipped when skip_special is set.
  // Throws ValueError for an id outside the vocabulary.
  virtual std::string decode(std::span<const TokenId> ids, bool skip_special = false) const = 0;

  // The bytes one token contributes in the middle of a sequence (SentencePiece's "▁" is a space).
  virtual std::string_view token_bytes(TokenId id) const = 0;
  // Whether decode() drops one leading space from the first non-empty token (SentencePiece's dummy
  // prefix); the streaming decoder needs this to reproduce decode() exactly.
  virtual bool strips_leading_space() const { return false; }
  virtual bool is_special(TokenId id) const = 0;
  // The tokenizer's normalizer (NFC for Qwen2; identity for most): decode(encode(x)) returns
  // normalize(x), exactly as Hugging Face does.
  virtual std::string normalize(std::string_view text) const { return std::string(text); }

  virtual size_t vocab_size() const = 0;  // one more than the largest id
  virtual std::optional<TokenId> token_to_id(std::string_view token_text) const = 0;

  std::optional<TokenId> bos_id() const { return bos_; }
  std::optional<TokenId> eos_id() const { return eos_; }
  std::optional<TokenId> pad_id() const { return pad_; }
  // What EncodeOptions::add_special puts before and after the ids of a text.
  const std::vector<TokenId>& special_prefix() const { return prefix_; }
  const std::vector<TokenId>& special_suffix() const { return suffix_; }

  // True when encode(a + b) == encode(a) ++ encode(b) whenever `a` ends with a printable ASCII
  // character followed by '\n' and `b` starts with a printable ASCII character: the corpus
  // tokenizer then splits work across threads at such points and still produces exactly the
  // single-threaded ids.
  virtual bool splits_at_newlines() const { return false; }

  // Short description for logs: kind, vocabulary size, pre-tokenizer.
  virtual std::string describe() const = 0;

 protected:
  std::optional<TokenId> bos_, eos_, pad_;
  std::vector<TokenId> prefix_, suffix_;
};

// Turns a stream of ids into text that never ends inside a UTF-8 character: bytes of an
// incomplete character are held back until the rest arrives. Invalid byte sequences (which a
// byte-level model can generate) are emitted as U+FFFD, one per maximal invalid subsequence, so
// the output is always valid UTF-8. flush() emits whatever is held back (as U+FFFD).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = true)
      : tok_(tokenizer), skip_special_(skip_special) {}
  std::string push(TokenId id);
  std::string flush();

 private:
  std::string drain(bool final);
  const Tokenizer& tok_;
  bool skip_special_;
  bool started_ = false;  // for the SentencePiece leading-space rule
  std::string pending_;
};


// A byte-level BPE vocabulary in the form llama.cpp keeps it in GGUF files (tokenizer.ggml.model
// "gpt2"): plain vectors, so the io layer can write and read it without knowing the tokenizer.
struct GgufBpeVocab {
  std::vector<std::string> tokens;  // id -> text: GPT-2 byte-to-unicode spelling; added tokens verbatim
  std::vector<int32_t> token_types; // llama.cpp token types: 1 normal, 3 control (special), 4 user-defined, 5 unused
  std::vector<std::string> merges;  // "left right" in rank order (byte-level spelling)
  std::string pre;                  // llama.cpp pre-tokenizer name: gpt-2, llama-bpe, qwen2 or smollm
  bool nfc = false;                 // NFC normalizer (kept in corelm.tokenizer.nfc; llama.cpp has none)
  bool ignore_merges = false;       // whole pre-tokens found in the vocabulary skip the merges
  std::optional<TokenId> bos, eos, unk, pad;
  bool add_bos = false, add_eos = false;
};

// The vocabulary of a byte-level BPE tokenizer file (tokenizer.json, vocab.json or a directory
// holding one), padded with unused "[PAD<id>]" tokens to `vocab_size` ids when that is larger.
// FormatError when the file is not byte-level BPE or its pre-tokenizer has no llama.cpp name.
GgufBpeVocab gguf_bpe_vocab_from_file(const std::string& tokenizer_path, size_t vocab_size = 0);
// The tokenizer a GGUF "gpt2" vocabulary describes; `source` (the GGUF path) names it in errors.
std::unique_ptr<Tokenizer> tokenizer_from_gguf_bpe(const GgufBpeVocab& vocab, const std::string& source);
// The same vocabulary as a Hugging Face tokenizer.json document (text), for `corelm convert --to hf`.
std::string gguf_bpe_vocab_to_tokenizer_json(const GgufBpeVocab& vocab, const std::string& source);

}  // namespace corelm
