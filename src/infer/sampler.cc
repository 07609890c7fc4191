// Sampler: logits -> token with Hugging Face's semantics for each knob, so a setting means the same
// here as in `model.generate(...)`. Probabilities are computed in double over the surviving
// candidates so the outcome depends only on the logits, the options and the seed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "corelm/error.h"
#include "corelm/generate.h"

namespace corelm::infer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using Candidates = std::vector<std::pair<float, TokenId>>;

// Softmax of the candidates' logits in double (any order), into `p` (a per-thread buffer: a
// 128 KiB vector per call was an mmap and page faults per sampled token).
const std::vector<double>& probabilities(const Candidates& c) {
  thread_local std::vector<double> p;
  p.resize(c.size());
  if (c.empty()) return p;
  double top = c.front().first, total = 0;
  for (const auto& x : c) top = std::max(top, double(x.first));
  for (size_t i = 0; i < c.size(); ++i) total += p[i] = std::exp(double(c[i].first) - top);
  for (double& x : p) x /= total;
  return p;
}

// Largest first, ties by id: a total order, so results never depend on the sort algorithm.
bool by_score(const std::pair<float, TokenId>& a, const std::pair<float, TokenId>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Sorts by by_score. The order is total, so the result is the same as std::sort's; a whole
// vocabulary (top-p without top-k) is sorted by an LSD radix sort of a 64-bit key (score
// descending, then id ascending), which took the sampler from most of a decode step to a few
// percent of it. -0 and +0 compare equal in by_score, so both map to the key of +0.
void sort_by_score(Candidates& c) {
  if (c.size() < 512) {
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return by_score(a, b); });
    return;
  }
  thread_local std::vector<std::pair<uint64_t, uint32_t>> a, b;  // (key, index into c)
  a.resize(c.size());
  b.resize(c.size());
  // The sort is stable, so when the candidates come in id order (they do: the whole vocabulary
  // in id order, or already sorted) the score alone (32 bits, 3 passes) gives by_score's order.
  bool id_order = true;
  for (size_t i = 1; i < c.size() && id_order; ++i) id_order = c[i - 1].second < c[i].second;
  for (size_t i = 0; i < c.size(); ++i) {
    float f = c[i].first == 0.0f ? 0.0f : c[i].first;
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // ascending float order
    a[i] = {(uint64_t(~ordered) << 32) | uint32_t(c[i].second), static_cast<uint32_t>(i)};
  }
  constexpr int kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  thread_local std::vector<uint32_t> count(kBuckets);
  for (int shift = id_order ? 32 : 0; shift < 64; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    for (const auto& x : a) ++count[(x.first >> shift) & (kBuckets - 1)];
    uint32_t sum = 0;
    for (auto& n : count) {
      const uint32_t k = n;
      n = sum;
      sum += k;
    }
    for (const auto& x : a) b[count[(x.first >> shift) & (kBuckets - 1)]++] = x;
    a.swap(b);
  }
  thread_local Candidates sorted;
  sorted.resize(c.size());
  for (size_t i = 0; i < c.size(); ++i) sorted[i] = c[a[i].second];
  c.swap(sorted);
}

// HF TopKLogitsWarper: keeps every token whose logit is >= the k-th largest (ties survive).
// Only partially orders the candidates.
void keep_top_k(Candidates& c, int64_t k) {
  if (k <= 0 || static_cast<size_t>(k) >= c.size()) return;
  const size_t kk = static_cast<size_t>(k);
  std::nth_element(c.begin(), c.begin() + (kk - 1), c.end(), by_score);
  const float kth = c[kk - 1].first;
  auto tail = std::partition(c.begin() + kk, c.end(), [kth](const auto& x) { return x.first >= kth; });
  c.erase(tail, c.end());
}

// HF TopPLogitsWarper: in ascending order, drops tokens while the cumulative probability is
// <= 1 - top_p; the most likely token always survives. Sorts the candidates.
void keep_top_p(Candidates& c, float top_p) {
  if (top_p >= 1.0f || c.size() <= 1) return;
  sort_by_score(c);
  const std::vector<double>& p = probabilities(c);
  double cumulative = 0;
  size_t keep = c.size();
  for (size_t i = c.size(); i-- > 1;) {
    cumulative += p[i];
    if (cumulative <= 1.0 - double(top_p)) keep = i;
    else break;
  }
  c.resize(keep);
}

// HF MinPLogitsWarper: drops tokens with p < min_p * p_max (order kept; the best survives).
void keep_min_p(Candidates& c, float min_p) {
  if (min_p <= 0.0f || c.size() <= 1) return;
  const std::vector<double>& p = probabilities(c);
  const double threshold = double(min_p) * *std::max_element(p.begin(), p.end());
  size_t out = 0;
  for (size_t i = 0; i < c.size(); ++i)
    if (p[i] >= threshold) c[out++] = c[i];
  c.resize(out);
}

}  // namespace

void SamplingOptions::validate() const {
  CORELM_CHECK(std::isfinite(temperature), ValueError, "temperature must be finite (got ", temperature, ")");
  CORELM_CHECK(temperature >= 0.0f, ValueError, "temperature must be >= 0 (got ", temperature, ")");
  CORELM_CHECK(top_k >= 0, ValueError, "top_k must be >= 0 (got ", top_k, "; 0 disables it)");
  CORELM_CHECK(top_p > 0.0f && top_p <= 1.0f, ValueError, "top_p must be in (0, 1] (got ", top_p, ")");
  CORELM_CHECK(min_p >= 0.0f && min_p <= 1.0f, ValueError, "min_p must be in [0, 1] (got ", min_p, ")");
  CORELM_CHECK(repetition_penalty > 0.0f && std::isfinite(repetition_penalty), ValueError,
               "repetition_penalty must be > 0 (got ", repetition_penalty, "; 1 disables it)");
  CORELM_CHECK(no_repeat_ngram_size >= 0, ValueError, "no_repeat_ngram_size must be >= 0 (got ",
               no_repeat_ngram_size, ")");
}

void apply_repetition_penalty(std::span<float> logits, std::span<const TokenId> context, float penalty) {
  if (penalty == 1.0f) return;
  std::vector<TokenId> seen(context.begin(), context.end());
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  for (TokenId id : seen) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
    float& x = logits[id];
    x = x < 0 ? x * penalty : x / penalty;
  }
}

void ban_repeated_ngrams(std::span<float> logits, std::span<const TokenId> context, int64_t n) {
  if (n <= 0) return;
  const int64_t len = static_cast<int64_t>(context.size());
  if (len + 1 < n) return;
  // The last n-1 tokens; every earlier n-gram starting with them bans its final token.
  std::span<const TokenId> prefix = context.subspan(len - (n - 1));
  for (int64_t i = 0; i + n <= len; ++i) {
    if (!std::equal(prefix.begin(), prefix.end(), context.begin() + i)) continue;
    TokenId banned = context[i + n - 1];
    if (banned >= 0 && static_cast<size_t>(banned) < logits.size()) logits[banned] = kNegInf;
  }
}

TokenId argmax(std::span<const float> logits) {
  CORELM_CHECK(!logits.empty(), ValueError, "argmax: empty logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<TokenId>(best);
}

Sampler::Sampler(SamplingOptions options, uint64_t seed) : options_(options), gen_(seed) { options_.validate(); }

namespace {

// Penalties, bans, temperature and the filters: the tokens that may be drawn, with their scaled
// logits. Empty when greedy (then `logits` holds the penalised scores to take the argmax of) or
// when every token is banned. The order is a function of the logits alone (id order, or by_score
// once a filter sorted them), so a draw does not depend on the standard library's algorithms.
void survivors(std::span<float> logits, std::span<const TokenId> context, const SamplingOptions& o, Candidates& c) {
  c.clear();
  apply_repetition_penalty(logits, context, o.repetition_penalty);
  ban_repeated_ngrams(logits, context, o.no_repeat_ngram_size);
  if (o.is_greedy()) return;
  // A huge logit over a small temperature can still overflow to +inf; clamped, the softmax stays
  // defined (the overflowing tokens share the mass) instead of turning into NaN.
  constexpr float kMax = std::numeric_limits<float>::max();
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != kNegInf && !std::isnan(logits[i]))
      c.emplace_back(std::clamp(logits[i] / o.temperature, -kMax, kMax), static_cast<TokenId>(i));
  keep_top_k(c, o.top_k);
  if (o.top_k > 0) sort_by_score(c);  // few left: cheap
  keep_top_p(c, o.top_p);
  keep_min_p(c, o.min_p);
}

}  // namespace

void warp_logits(std::span<float> logits, std::span<const TokenId> context, const SamplingOptions& options) {
  options.validate();
  Candidates c;
  survivors(logits, context, options, c);
  if (options.is_greedy()) return;
  std::fill(logits.begin(), logits.end(), kNegInf);
  for (const auto& [score, id] : c) logits[id] = score;
}

TokenId Sampler::sample(std::span<float> logits, std::span<const TokenId> context, int64_t allowed_vocab) {
  CORELM_CHECK(!logits.empty(), ValueError, "sample: empty logits");
  if (allowed_vocab > 0 && static_cast<size_t>(allowed_vocab) < logits.size())
    logits = logits.first(static_cast<size_t>(allowed_vocab));
  Candidates& c = scratch_;
  survivors(logits, context, options_, c);
  // Greedy, or everything banned: the argmax of the (penalised) scores rather than a failure.
  if (c.empty()) return argmax(logits);
  const std::vector<double>& p = probabilities(c);
  double u = gen_.uniform(), cumulative = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    cumulative += p[i];
    if (u < cumulative) return c[i].second;
  }
  return c.back().second;  // rounding left u just above the total
}

}  // namespace corelm::infer
