// Small random-weight decoder configs shared by the model tests (fast path, int8 path).
#pragma once
#include <cstdint>
#include <vector>

#include "corelm/model.h"
#include "corelm/tensor.h"

namespace corelm::testing {

// A 2-layer GQA decoder: llama with tied embeddings, or qwen2 with QKV bias and an untied head.
// `init_range` above HF's 0.02 gives logits real margins, so argmax comparisons mean something.
inline model::ModelConfig small_decoder_config(bool qwen2, double init_range) {
  model::ModelConfig c;
  c.model_type = qwen2 ? "qwen2" : "llama";
  c.attention_bias = qwen2;
  c.vocab_size = 384;
  c.hidden_size = 128;
  c.intermediate_size = 320;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 96;
  c.tie_word_embeddings = !qwen2;
  c.initializer_range = init_range;
  return c;
}

// A 2-layer GQA llama (hidden 64, context 64, tied embeddings) over `vocab` tokens: small enough
// for whole generation runs in a unit test. Pass an `init_range` above HF's 0.02 where greedy
// comparisons need well separated logits (no near-ties).
inline model::ModelConfig tiny_decoder_config(int64_t vocab, double init_range) {
  model::ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = true;
  c.initializer_range = init_range;
  return c;
}

// n token ids in [0, vocab), a fixed LCG stream per seed.
inline std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int64_t>((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33) % vocab;
  return v;
}

inline Tensor ids_of(const std::vector<int64_t>& v, int64_t B, int64_t T) { return Tensor::from_vector(v, {B, T}); }

}  // namespace corelm::testing
