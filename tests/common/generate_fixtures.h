// What the generation tests share: a byte-level BPE trained in the test on seeded pseudo-text, and
// greedy generation options. The small decoder they run is tiny_decoder_config (model_factories.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "corelm/generate.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"

namespace corelm::testing {

// `n_words` words drawn from `words` by a seeded xorshift, a sentence ending (".\n") after every
// `sentence_words`-th: enough repetition for BPE to learn merges, identical on every run.
inline std::string pseudo_text(const std::vector<std::string>& words, uint64_t seed, int n_words, int sentence_words) {
  std::string text;
  uint64_t x = seed;
  for (int i = 0; i < n_words; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    text += words[x % words.size()];
    text += (i % sentence_words == sentence_words - 1) ? ".\n" : " ";
  }
  return text;
}

// Trains a byte-level BPE of `vocab_size` on `text` into dir/tokenizer.json (the corpus goes to
// dir/corpus.txt; `dir` must exist) and loads it.
inline std::unique_ptr<Tokenizer> train_small_bpe(const std::filesystem::path& dir, const std::string& text,
                                                  size_t vocab_size) {
  std::ofstream(dir / "corpus.txt", std::ios::binary) << text;
  BpeTrainOptions opt;
  opt.vocab_size = vocab_size;
  train_bpe({(dir / "corpus.txt").string()}, opt, (dir / "tokenizer.json").string());
  return Tokenizer::load((dir / "tokenizer.json").string());
}

// Greedy decoding of up to `max_new_tokens` tokens; eos stops it only when asked, so most tests
// get runs of a known length.
inline infer::GenerateOptions greedy_options(int64_t max_new_tokens, bool stop_at_eos = false) {
  infer::GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.sampling.greedy = true;
  o.stop_at_eos = stop_at_eos;
  return o;
}

}  // namespace corelm::testing
