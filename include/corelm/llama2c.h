// llama2.c interop: the "v0" checkpoint (.bin: 7 x int32 header, then fp32 weights in llama2.c
// order) and the tokenizer.bin vocabulary (pieces + scores), with run.c's encode/decode rules.
// The io layer knows nothing of the model: a checkpoint is its header plus its arrays under
// llama2.c's own names; model::llama2c_model (corelm/architecture.h) turns them into the
// decoder's config and parameters.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "corelm/gguf.h"
#include "corelm/tensor.h"

namespace corelm::io {

struct Llama2cHeader {
  int32_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;  // vocab_size > 0 in the file; negative means a separate wcls
};

struct Llama2cCheckpoint {
  Llama2cHeader header;
  // llama2.c's TransformerWeights names, in file order: token_embedding_table [V, dim];
  // rms_att_weight [L, dim]; wq [L, q_dim, dim]; wk, wv [L, kv_dim, dim]; wo [L, dim, q_dim];
  // rms_ffn_weight [L, dim]; w1, w3 [L, hidden, dim]; w2 [L, dim, hidden]; rms_final_weight [dim];
  // wcls [V, dim] (separate classifier only). Rows as stored (q/k in interleaved RoPE order).
  std::vector<std::pair<std::string, Tensor>> tensors;
};

// IOError when unreadable; FormatError naming the file (and the tensor being read) for a bad
// header or a size that does not match the header.
Llama2cHeader read_llama2c_header(const std::string& path);
Llama2cCheckpoint load_llama2c_checkpoint(const std::string& path);

// llama2.c's tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 len, bytes.
class Llama2cTokenizer {
 public:
  static constexpr int64_t kBos = 1;
  static constexpr int64_t kEos = 2;

  // vocab_size: number of tokens to read (the checkpoint's); -1 reads to the end of the file.
  static Llama2cTokenizer load(const std::string& path, int64_t vocab_size = -1);
  // From a GGUF SentencePiece-style ("llama") vocabulary: pieces with U+2581 for spaces (turned
  // back into spaces, as tokenizer.bin holds them) and <s>/</s> for BOS/EOS. Ids 1 and 2 must be
  // BOS and EOS and byte pieces <0xXX> sit at id byte + 3, as run.c assumes (FormatError otherwise).
  static Llama2cTokenizer from_gguf_pieces(const std::vector<std::string>& pieces, const std::vector<float>& scores,
                                           const std::string& source);

  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  const std::string& piece(int64_t id) const;  // IndexError when out of range
  float score(int64_t id) const;
  int64_t max_token_length() const { return max_token_length_; }

  // run.c encode(): optional BOS, a dummy-prefix " " for non-empty text, per-UTF-8-codepoint
  // lookup with byte fallback (<0xXX> = id byte+3), then repeated merge of the adjacent pair whose
  // concatenation is the best-scoring vocab piece; optional EOS.
  std::vector<int64_t> encode(const std::string& text, bool bos, bool eos) const;
  // run.c decode(): the piece, without its leading space after BOS, <0xXX> pieces as that byte.
  std::string decode(int64_t prev, int64_t id) const;
  // run.c safe_printf(): what it would print for that piece (nothing for a lone control byte;
  // C-string semantics, so output stops at a NUL byte).
  static std::string printable(const std::string& piece);

  // The vocabulary as llama.cpp's SentencePiece ("llama") tokenizer keys: tokenizer.ggml.model,
  // tokens (spaces as U+2581, BOS/EOS as <s>/</s>), scores, token_type (2 unknown, 3 control,
  // 6 byte, 1 normal), bos/eos/unknown ids and add_bos_token.
  std::vector<std::pair<std::string, GGUFValue>> gguf_metadata() const;

 private:
  int64_t lookup(const std::string& s) const;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<std::pair<std::string, int64_t>> sorted_;  // piece -> id, for lookups
  int64_t max_token_length_ = 0;
};

}  // namespace corelm::io
