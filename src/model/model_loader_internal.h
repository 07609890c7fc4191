// Pieces shared by the model loader's translation units (not a public contract).
#pragma once
#include <memory>
#include <string>

#include "corelm/llama2c.h"
#include "corelm/tokenizer.h"

namespace corelm::model::detail {

// A corelm::Tokenizer over a llama2.c / GGUF "llama" vocabulary with run.c's encode and decode
// rules (SentencePiece BPE with byte fallback): BOS 1 and EOS 2, add_special prepends BOS, and
// decode drops the dummy-prefix space of the first piece.
std::unique_ptr<Tokenizer> make_llama2c_tokenizer(io::Llama2cTokenizer vocab, const std::string& source);

// Tokenizer::load, plus llama2.c tokenizer.bin files (any other *.bin) sized to `vocab_size`.
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path, int64_t vocab_size);

}  // namespace corelm::model::detail
