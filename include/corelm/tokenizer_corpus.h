// Corpus -> binary token file for the trainer: a flat little-endian array of uint16 or uint32 ids
// (memory-mappable, no header) plus a small JSON sidecar "<output>.json" with dtype, token count
// and vocabulary size. Multi-threaded; the ids never depend on the thread count.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "corelm/tokenizer.h"

namespace corelm {

enum class TokenDType { kAuto, kUInt16, kUInt32 };

struct TokenFileOptions {
  TokenDType dtype = TokenDType::kAuto;  // auto: uint16 when every id fits, else uint32
  int threads = 1;
  bool add_special = false;    // BOS/EOS around each document
  bool parse_special = false;  // special-token text in the corpus stays plain text by default
  bool jsonl = false;          // each line is a document: a JSON string or an object with "text"
  bool progress = false;       // progress line on stderr
  size_t chunk_bytes = size_t(4) << 20;  // work unit per thread
};

struct TokenFileStats {
  uint64_t bytes = 0, tokens = 0, documents = 0;
  double seconds = 0;
  int dtype_bytes = 0;
};

// In text mode each input file is one document. Throws IOError/FormatError naming the file (and
// line for JSONL) on bad input.
TokenFileStats tokenize_to_file(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                                const std::string& output, const TokenFileOptions& options);

// Encodes one large text with `threads` threads, exactly as tokenizer.encode would (it splits
// only where Tokenizer::splits_at_newlines() guarantees that).
std::vector<TokenId> encode_parallel(const Tokenizer& tokenizer, std::string_view text, const EncodeOptions& options,
                                     int threads);

// Positions where a text may be cut for independent encoding: just after a '\n' that has a
// printable ASCII character on both sides. Returns a cut at or after `from` (text.size() if none).
size_t next_safe_cut(std::string_view text, size_t from);

}  // namespace corelm
