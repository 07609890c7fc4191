// A llama-bench-style test matrix over a Decoder: prompt processing (ppN: N prompt tokens in one
// forward, last-token logits) and token generation (tgN: N single-token decode steps, full LM head),
// each at a context depth (the cache already holding d tokens: "pp512 @ d4096"), repeated and
// summarised as llama-bench does (avg_ts, stddev_ts over the repetitions' tokens/s). Caches come
// from Decoder::make_cache, so the decoder's KV cache types are what is measured.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "corelm/model.h"

namespace corelm::infer {

struct BenchTest {
  std::string name;  // "pp512", "tg128", "pp512 @ d4096" (llama-bench's spelling)
  int64_t n_prompt = 0, n_gen = 0, n_depth = 0;
  std::vector<double> samples_ts;  // tokens/s of each timed repetition
  double avg_ts = 0, stddev_ts = 0;
  int64_t kv_bytes = 0;  // memory of the test's KV cache (depth + its tokens, one row)
};

struct BenchMatrixOptions {
  std::vector<int64_t> pp{512}, tg{128}, depth{0};  // a value of 0 in pp/tg skips that kind
  int repetitions = 5;                               // timed runs per test, after one warm-up
  uint64_t seed = 1;                                 // random token ids
};

// Every depth x (pp values, then tg values), in that order. ValueError when depth + tokens exceeds
// the model context or a count is negative.
std::vector<BenchTest> run_bench_matrix(const model::Decoder& decoder, const BenchMatrixOptions& options);

// Bytes of one KV cache row holding `positions` tokens with the decoder's cache types: the full-
// attention layers' bytes per token (block-quantized types count their scales) times positions,
// plus what a row holds whatever its length (sliding-window rings, linear-attention states).
int64_t kv_cache_bytes(const model::Decoder& decoder, int64_t positions);

// The largest context (tokens of one sequence) whose KV cache fits in `budget` bytes: 0 when even
// the fixed part does not fit, -1 when nothing grows with the context (no full-attention layer).
int64_t max_context_for_kv_budget(const model::Decoder& decoder, int64_t budget);

}  // namespace corelm::infer
