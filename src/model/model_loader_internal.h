// Pieces shared by the model loader's translation units (not a public contract).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "corelm/durable.h"
#include "corelm/llama2c.h"
#include "corelm/tokenizer.h"

namespace corelm::model::detail {

// A corelm::Tokenizer over a llama2.c / GGUF "llama" vocabulary with run.c's encode and decode
// rules (SentencePiece BPE with byte fallback): BOS 1 and EOS 2, add_special prepends BOS, and
// decode drops the dummy-prefix space of the first piece.
std::unique_ptr<Tokenizer> make_llama2c_tokenizer(io::Llama2cTokenizer vocab, const std::string& source);

// Tokenizer::load, plus llama2.c tokenizer.bin files (any other *.bin) sized to `vocab_size`.
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path, int64_t vocab_size);

// Files a model directory is made of (config, weights, tokenizer, generation config): what a
// replaced model directory drops. Anything else there (README.md, LICENSE, .git, ...) is kept.
bool is_model_file(const std::string& name);

// IOError when `dir` exists but is not a folder, or is a non-empty folder without any model file
// (a mistyped OUT such as the home folder is never swapped away).
void check_replaceable_model_dir(const std::string& dir);

// A StagedDir for model directory `dir` (its parent created if missing), holding hard links (or
// copies) of the entries of the current `dir` for which keep(name) is true. The caller writes the
// new files into path() and commits once.
std::unique_ptr<StagedDir> stage_model_dir(const std::string& dir, const std::function<bool(const std::string&)>& keep);

}  // namespace corelm::model::detail
