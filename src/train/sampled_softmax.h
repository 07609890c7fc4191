// Sampled softmax for training: a unigram proposal with a count floor, and the per-step candidate
// set (batch targets plus sampled negatives) with its logQ correction for
// ops::sampled_linear_cross_entropy.
//
// Proposal: q(v) ∝ max(count(v), floor)^alpha over the training split's token counts. The floor is
// what keeps sampled softmax honest: a row that is never drawn as a negative keeps its logit near
// its initial value while trained-but-wrong rows are pushed far down, so never-seen or rare tokens
// become argmax attractors whenever the model is unsure. With floor 32 a token seen once is drawn
// as often as one seen 32 times, so every row of the LM head gets real negative gradient.
//
// Draws are a pure function of (seed, step, micro-batch), so a resumed run repeats them exactly
// with nothing extra in the checkpoint.
#pragma once
#include <cstdint>
#include <vector>

#include "corelm/random.h"
#include "corelm/tensor.h"
#include "corelm/train.h"

namespace corelm::train {

// How often each id in [0, vocab) occurs in tokens [begin, end) of `data` (ids >= vocab ->
// ValueError naming the id).
std::vector<int64_t> count_tokens(const TokenDataset& data, int64_t begin, int64_t end, int64_t vocab);

class UnigramProposal {
 public:
  // ValueError for empty counts, a negative or non-finite floor, alpha <= 0, or no mass at all.
  UnigramProposal(const std::vector<int64_t>& counts, double count_floor, double alpha);

  int64_t vocab() const { return static_cast<int64_t>(prob_.size()); }
  double prob(int64_t id) const { return prob_[static_cast<size_t>(id)]; }
  const std::vector<double>& probs() const { return prob_; }
  // The smallest q > 0; a target of probability 0 (floor 0, id never counted) is corrected as if
  // it had this probability, so its logit stays finite.
  double min_positive() const { return min_positive_; }
  int64_t draw(Generator& gen) const;  // one id ~ q (53-bit uniform, binary search of the CDF)

 private:
  std::vector<double> prob_, cdf_;
  double min_positive_ = 0;
};

struct CandidateSet {
  Tensor candidates;      // i64 [C], strictly increasing: the targets of the batch and the negatives
  Tensor log_correction;  // f32 [C]: log P(c is in the drawn set) = log(1 - (1 - q_c)^negatives)
  int64_t sampled = 0;    // distinct ids among the negatives drawn
};

// Draws `negatives` ids with replacement from q (seeded by seed, step and micro_batch), merges them
// with the non-ignored targets and returns the sorted union with its correction. ValueError when
// negatives < 1 or > q.vocab(), or a target lies outside the vocabulary.
CandidateSet draw_candidates(const UnigramProposal& q, int64_t negatives, const Tensor& targets, uint64_t seed,
                             int64_t step, int64_t micro_batch, int64_t ignore_index = -100);

}  // namespace corelm::train
