// Supervised fine-tuning data: JSONL {"input": ..., "output": ...} pairs. The model sees
// input ++ output (++ EOS) and is scored only on the output tokens. There is no cross-pair
// packing: causal_attention cannot keep attention inside each pair, so each row holds one pair,
// padded (see docs/TRAINING.md).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "corelm/train.h"

#include "jsonl_records.h"

namespace corelm::train {

size_t sft_validation_pairs(size_t pairs, double val_fraction) {
  check_val_fraction(val_fraction);
  if (val_fraction == 0 || pairs < 2) return 0;
  return std::max<size_t>(1, static_cast<size_t>(static_cast<double>(pairs) * val_fraction));
}

std::vector<SftPair> load_sft_pairs(const std::string& path, const Tokenizer& tokenizer) {
  std::vector<SftPair> pairs;
  detail::for_each_jsonl_record(path, [&](const nlohmann::json& j, const std::string& where) {
    CORELM_CHECK(j.is_object(), FormatError, where, ": expected an object {\"input\": ..., \"output\": ...}");
    for (const char* key : {"input", "output"})
      CORELM_CHECK(j.contains(key) && j[key].is_string(), FormatError, where, ": missing string field \"", key,
                   "\"");
    SftPair p;
    p.input = tokenizer.encode(j["input"].get<std::string>());
    p.output = tokenizer.encode(j["output"].get<std::string>());
    if (tokenizer.eos_id()) p.output.push_back(*tokenizer.eos_id());
    CORELM_CHECK(!p.output.empty(), FormatError, where, ": empty \"output\" (nothing to learn from)");
    pairs.push_back(std::move(p));
  });
  CORELM_CHECK(!pairs.empty(), FormatError, path, ": no pairs");
  return pairs;
}

Batch make_sft_batch(const std::vector<const SftPair*>& pairs, int64_t seq, TokenId pad_id) {
  const int64_t rows = static_cast<int64_t>(pairs.size());
  CORELM_CHECK(rows > 0 && seq > 0, ValueError, "make_sft_batch: empty batch or seq");
  std::vector<int64_t> ids(rows * seq, pad_id), targets(rows * seq, -100);
  for (int64_t r = 0; r < rows; ++r) {
    const SftPair& p = *pairs[r];
    std::vector<int64_t> toks(p.input.begin(), p.input.end());
    toks.insert(toks.end(), p.output.begin(), p.output.end());
    const int64_t n_in = static_cast<int64_t>(p.input.size());
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(toks.size()), seq + 1);
    for (int64_t t = 0; t + 1 < n; ++t) {
      ids[r * seq + t] = toks[t];
      // position t predicts token t + 1; only output tokens carry a loss
      if (t + 1 >= n_in) targets[r * seq + t] = toks[t + 1];
    }
  }
  return Batch{Tensor::from_vector(ids, {rows, seq}), Tensor::from_vector(targets, {rows, seq})};
}

SftSampler::SftSampler(const std::vector<SftPair>& pairs, size_t begin, size_t end, TokenId pad_id, uint64_t seed)
    : pairs_(pairs), begin_(begin), end_(end), pad_(pad_id), gen_(seed) {
  CORELM_CHECK(begin < end && end <= pairs.size(), ValueError, "SftSampler: pair range [", begin, ", ", end,
               ") is empty or outside the ", pairs.size(), " pairs");
}

Batch SftSampler::next(int64_t batch, int64_t seq) {
  std::vector<const SftPair*> rows;
  for (int64_t b = 0; b < batch; ++b) rows.push_back(&pairs_[begin_ + gen_.below(end_ - begin_)]);
  drawn_ += batch;
  return make_sft_batch(rows, seq, pad_);
}

}  // namespace corelm::train
