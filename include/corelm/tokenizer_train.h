// Byte-level BPE training: learns merges from a corpus and writes a Hugging Face tokenizer.json
// (ByteLevel pre-tokenizer/decoder, BPE model) that both corelm and HF tokenizers load.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace corelm {

struct BpeTrainOptions {
  size_t vocab_size = 8192;         // 256 byte tokens + merges + special tokens
  std::string pattern = "gpt2";     // pre-tokenizer: gpt2 | llama3 | qwen2
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
  uint64_t min_frequency = 2;       // stop when the best pair is rarer than this
  size_t max_distinct_words = size_t(4) << 20;  // memory bound for the word-count table
  bool progress = false;
};

struct BpeTrainStats {
  uint64_t bytes = 0, words = 0, distinct_words = 0, merges = 0;
  size_t vocab_size = 0;
  double count_seconds = 0, merge_seconds = 0;
};

// Streams the inputs (each read in bounded blocks), counts pre-tokens, learns merges, writes
// `output` (a tokenizer.json) atomically: a unique temp file beside it, renamed over it, removed
// on any failure, so concurrent trainers never share a temp name and nothing is left behind.
// `output` must be a file path in an existing folder (checked before training). Throws
// IOError/ValueError with the file or option at fault.
BpeTrainStats train_bpe(const std::vector<std::string>& inputs, const BpeTrainOptions& options,
                        const std::string& output);

}  // namespace corelm
