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

// Reads DIR/config.json, DIR/model.safetensors and DIR/tokenizer.json. Every parameter of the
// config must be present with the right shape (a tied model may omit lm_head.weight; an untied
// one may not); tensors in other dtypes (bf16/f16) are converted to f32. Throws IOError for a
// missing file and FormatError naming the file and tensor for anything that does not fit.
LoadedModel load_model_dir(const std::string& dir);

// Writes DIR/config.json and DIR/model.safetensors (atomically; DIR is created if missing).
// The tokenizer is the caller's business (copy its tokenizer.json).
void save_model_dir(const std::string& dir, const Decoder& decoder);

}  // namespace corelm::model
