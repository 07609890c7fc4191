// A model directory as `corelm train` writes it and Hugging Face lays it out: config.json,
// model.safetensors (HF parameter names) and tokenizer.json. Loading one gives a ready decoder
// (inference or fine-tuning) plus its tokenizer.
#pragma once
#include <memory>
#include <string>

#include "corelm/model.h"
#include "corelm/tokenizer.h"

namespace corelm::model {

struct LoadedModel {
  Decoder decoder;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Reads DIR/config.json, DIR/model.safetensors (or its shards) and DIR/tokenizer.json (or the
// other tokenizer files load_model finds) through load_model: every parameter of the config must
// be present with the right shape (a tied model may omit lm_head.weight; an untied one may not)
// and finite; tensors in other dtypes (bf16/f16) are converted to f32. Throws IOError for a
// missing file and FormatError naming the file and tensor for anything that does not fit.
LoadedModel load_model_dir(const std::string& dir);

// Writes DIR/config.json and DIR/model.safetensors as one step: the folder is staged beside DIR
// and swapped in whole (corelm::StagedDir), so a reader or a crash sees the old pair or the new
// one, never new weights beside an old config. Other files already in DIR (tokenizer.json,
// README.md, ...) are kept; weight shards of another layout are dropped. DIR is created if
// missing; a non-empty DIR holding no model file at all is refused (IOError), never replaced.
// The tokenizer is the caller's business (copy its tokenizer.json).
void save_model_dir(const std::string& dir, const Decoder& decoder);

// The same two files written into an existing folder file by file (each atomic, the pair not):
// for writers that stage the folder themselves and commit it once.
void write_model_files(const std::string& dir, const Decoder& decoder);

}  // namespace corelm::model
