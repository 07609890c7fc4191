// What the trainer needs of src/train/checkpoint.cc beyond the public API in corelm/train.h.
#pragma once
#include <string>
#include <vector>

#include "corelm/model.h"
#include "corelm/tensor.h"
#include "corelm/train.h"

namespace corelm::train::detail {

// save_checkpoint with the tokenizer's bytes instead of its path (null: no tokenizer). train()
// reads them once at the start: on resume the file it came from is inside a step folder that
// --keep-checkpoints may remove during the run.
std::string save_checkpoint_bytes(const std::string& out_dir, const model::Decoder& model,
                                  const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                  const TrainerState& state, const std::string* tokenizer_bytes);

// Points the model files at the top of out_dir at the checkpoint `latest` names, repairing a
// save interrupted between its pointer and its links. No-op without a step-folder checkpoint.
void sync_model_view(const std::string& out_dir);

std::string read_file(const std::string& path);

}  // namespace corelm::train::detail
