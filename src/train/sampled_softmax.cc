#include "train/sampled_softmax.h"

#include <algorithm>
#include <cmath>

#include "corelm/error.h"

namespace corelm::train {

std::vector<int64_t> count_tokens(const TokenDataset& data, int64_t begin, int64_t end, int64_t vocab) {
  CORELM_CHECK(vocab > 0, ValueError, "count_tokens: vocab must be positive, got ", vocab);
  CORELM_CHECK(begin >= 0 && begin <= end && end <= data.size(), ValueError, "count_tokens: range [", begin, ", ",
               end, ") outside the dataset of ", data.size(), " tokens");
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t id = data[i];
    CORELM_CHECK(id < vocab, ValueError, "count_tokens: token id ", id, " at ", i, " is outside the vocabulary of ",
                 vocab);
    ++counts[static_cast<size_t>(id)];
  }
  return counts;
}

UnigramProposal::UnigramProposal(const std::vector<int64_t>& counts, double count_floor, double alpha) {
  CORELM_CHECK(!counts.empty(), ValueError, "sampled softmax: no token counts for the proposal");
  CORELM_CHECK(std::isfinite(count_floor) && count_floor >= 0, ValueError,
               "sampled softmax: the count floor must be >= 0, got ", count_floor);
  CORELM_CHECK(std::isfinite(alpha) && alpha > 0, ValueError, "sampled softmax: alpha must be > 0, got ", alpha);
  prob_.resize(counts.size());
  double total = 0;
  for (size_t v = 0; v < counts.size(); ++v) {
    const double c = std::max(static_cast<double>(counts[v]), count_floor);
    prob_[v] = c > 0 ? std::pow(c, alpha) : 0.0;
    total += prob_[v];
  }
  CORELM_CHECK(total > 0, ValueError, "sampled softmax: every token count is 0 and the floor is 0");
  cdf_.resize(counts.size());
  double running = 0;
  min_positive_ = 1.0;
  for (size_t v = 0; v < prob_.size(); ++v) {
    prob_[v] /= total;
    running += prob_[v];
    cdf_[v] = running;
    if (prob_[v] > 0) min_positive_ = std::min(min_positive_, prob_[v]);
  }
}

int64_t UnigramProposal::draw(Generator& gen) const {
  // Scaled by the CDF's own end so rounding in the running sum can never leave a gap at the top.
  const double u = static_cast<double>(gen.next_u64() >> 11) * 0x1.0p-53 * cdf_.back();
  const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  int64_t id = std::min<int64_t>(it - cdf_.begin(), vocab() - 1);
  while (prob_[static_cast<size_t>(id)] == 0) --id;  // u landed exactly on a flat step's edge
  return id;
}

CandidateSet draw_candidates(const UnigramProposal& q, int64_t negatives, const Tensor& targets, uint64_t seed,
                             int64_t step, int64_t micro_batch, int64_t ignore_index) {
  const int64_t vocab = q.vocab();
  CORELM_CHECK(negatives >= 1 && negatives <= vocab, ValueError, "sampled softmax: negatives must be in [1, ",
               vocab, "] (the vocabulary size), got ", negatives);
  // One stream per (seed, step, micro-batch): nothing to checkpoint, and resume repeats the draws.
  Generator gen(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1)) ^
                (0xC2B2AE3D27D4EB4Full * static_cast<uint64_t>(micro_batch + 1)));
  std::vector<uint8_t> in_set(static_cast<size_t>(vocab), 0);
  CandidateSet out;
  for (int64_t i = 0; i < negatives; ++i) {
    uint8_t& mark = in_set[static_cast<size_t>(q.draw(gen))];
    out.sampled += mark == 0;
    mark = 1;
  }
  for (int64_t t : targets.to_int_vector()) {
    if (t == ignore_index) continue;
    CORELM_CHECK(t >= 0 && t < vocab, ValueError, "sampled softmax: target ", t, " is outside the vocabulary of ",
                 vocab);
    in_set[static_cast<size_t>(t)] = 1;
  }
  std::vector<int64_t> ids;
  std::vector<float> corr;
  for (int64_t v = 0; v < vocab; ++v) {
    if (!in_set[static_cast<size_t>(v)]) continue;
    ids.push_back(v);
    const double p = q.prob(v) > 0 ? q.prob(v) : q.min_positive();
    // log(1 - (1 - p)^n), computed without cancellation for small p.
    corr.push_back(static_cast<float>(std::log(-std::expm1(static_cast<double>(negatives) * std::log1p(-p)))));
  }
  const int64_t c = static_cast<int64_t>(ids.size());
  out.candidates = Tensor::from_vector(ids, {c});
  out.log_correction = Tensor::from_vector(corr, {c});
  return out;
}

}  // namespace corelm::train
