// SentencePiece .model files (Llama-2 style) through Debian's libsentencepiece.
#pragma once
#include <memory>
#include <string>

#include "corelm/tokenizer.h"

namespace corelm::tok {

// config_path: an optional tokenizer_config.json (bos/eos, add_bos_token/add_eos_token).
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path, const std::string& config_path);

}  // namespace corelm::tok
