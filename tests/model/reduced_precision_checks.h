// Checks shared by the reduced-precision fast paths (int8, q4): greedy decoding of one target row
// alone and among other rows, and the real trained stories260K as a yardstick.
#pragma once
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/model_factories.h"
#include "corelm/model.h"
#include "corelm/model_loader.h"
#include "corelm/thread_pool.h"

namespace corelm::model::testing_support {

// Greedy decoding of a target row placed at `row_of_target` in a batch of `batch` rows on `threads`
// threads: the other rows hold prompts of other lengths and already-cached prefixes. Returns the
// target's tokens and its logits at every step, to compare with the same row decoded alone.
inline std::pair<std::vector<int64_t>, std::vector<float>> greedy_target_row(const Decoder& d, int64_t batch,
                                                                            int64_t row_of_target, int threads) {
  const int64_t V = d.config().vocab_size, T = 9, steps = 12;
  const auto argmax = [V](const float* v) { return int64_t(std::max_element(v, v + V) - v); };
  using corelm::testing::ids_of;
  using corelm::testing::random_ids;
  set_num_threads(threads);
  KVCache cache(d.config(), batch, 64);
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch; ++b) {
    rows.push_back(b);
    if (b != row_of_target) d.forward_cached(ids_of(random_ids(3 + b, V, 70 + b), 1, 3 + b), cache, {b});
  }
  std::vector<int64_t> prompt;  // the target's prompt; the others get their own
  for (int64_t b = 0; b < batch; ++b) {
    const auto p = random_ids(T, V, b == row_of_target ? 5 : 90 + b);
    prompt.insert(prompt.end(), p.begin(), p.end());
  }
  Tensor logits = d.forward_cached(ids_of(prompt, batch, T), cache, rows, Logits::Last);
  std::vector<int64_t> tokens;
  std::vector<float> trace;
  for (int64_t s = 0; s < steps; ++s) {
    const auto v = logits.to_float_vector();
    trace.insert(trace.end(), v.begin() + row_of_target * V, v.begin() + (row_of_target + 1) * V);
    std::vector<int64_t> next;
    for (int64_t b = 0; b < batch; ++b) next.push_back(argmax(&v[b * V]));
    tokens.push_back(next[row_of_target]);
    logits = d.forward_cached(ids_of(next, batch, 1), cache, rows, Logits::Last);
  }
  set_num_threads(1);
  return {tokens, trace};
}

// The real trained stories260K: teacher-forced next-token argmax of a precision against the f32
// reference over the f32 model's own greedy text from BOS (greedy generations would diverge at the
// first near-tie and say little).
inline std::string stories260k_path() {
  return std::string(CORELM_SOURCE_DIR) + "/../shared/data/models/stories260K/stories260K.bin";
}

// Positions (of T) where `precision` picks the reference's argmax; nullopt when the model file is
// absent (the caller skips, naming stories260k_path()).
inline std::optional<int64_t> stories260k_top1_agreement(Precision precision, int64_t T = 200) {
  if (!std::filesystem::exists(stories260k_path())) return std::nullopt;
  LoadOptions options;
  options.require_tokenizer = false;
  Checkpoint ckpt = load_model(stories260k_path(), options);
  Decoder& d = ckpt.model.decoder;
  const int64_t V = d.config().vocab_size;
  const auto argmax = [V](const float* v) { return int64_t(std::max_element(v, v + V) - v); };
  std::vector<int64_t> stream{1};
  {
    KVCache cache(d.config(), 1, T + 1);
    for (int64_t i = 0; i < T - 1; ++i) {
      auto v = d.forward_cached(corelm::testing::ids_of({stream.back()}, 1, 1), cache, {0}, Logits::Last).to_float_vector();
      stream.push_back(argmax(v.data()));
    }
  }
  const auto top1 = [&] {
    KVCache cache(d.config(), 1, T);
    const auto v = d.forward_cached(corelm::testing::ids_of(stream, 1, T), cache, {0}).to_float_vector();
    std::vector<int64_t> out;
    for (int64_t t = 0; t < T; ++t) out.push_back(argmax(&v[t * V]));
    return out;
  };
  const auto ref = top1();
  d.prepare_inference(precision);
  const auto got = top1();
  int64_t agree = 0;
  for (int64_t t = 0; t < T; ++t) agree += ref[t] == got[t];
  return agree;
}

}  // namespace corelm::model::testing_support
