// The real trained stories260K as a yardstick for a reduced-precision fast path: teacher-forced
// next-token argmax of `precision` against the f32 reference over the f32 model's own greedy text
// from BOS (greedy generations would diverge at the first near-tie and say little).
#pragma once
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/model_factories.h"
#include "corelm/model.h"
#include "corelm/model_loader.h"

namespace corelm::model::testing_support {

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
