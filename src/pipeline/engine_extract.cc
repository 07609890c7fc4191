// The extract task: greedy decoding per document, optionally constrained to a list of choices or a
// regex. Constraints (infer::TokenConstraint, the engine the server uses too) pick the most likely
// token among those that keep the output completable; EOS is allowed once the output is complete.
// Stop strings cut the text where they begin. No token budget is passed to the constraint, so
// outputs are those of plain masked greedy decoding (an output cut by --max-tokens ends "length").
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "corelm/error.h"
#include "pipeline/engine.h"

namespace corelm::pipeline {
namespace {

struct DecodeRow {
  std::vector<TokenId> out;
  std::string text;
  double logprob = 0;
  std::optional<infer::TokenConstraint> con;
  bool done = false;
  std::string finish = "length";
};

constexpr int64_t kNoBudget = std::numeric_limits<int64_t>::max() / 4;

}  // namespace

void Engine::extract(const std::vector<PreparedDoc*>& docs) {
  const size_t B = docs.size();
  std::vector<int64_t> rows(B);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<DecodeRow> st(B);
  const std::optional<TokenId> eos = tok_.eos_id();
  const bool constrained = constraint_.has_value();
  if (constrained)
    for (auto& s : st) s.con.emplace(constraint_->clone());
  std::vector<float> masked;
  // One decoding step of row i from its logits.
  auto step = [&](size_t i, const float* row) {
    DecodeRow& s = st[i];
    const double lse = [&] {
      float m = -INFINITY;
      for (int64_t v = 0; v < vocab_; ++v) m = std::max(m, row[v]);
      double z = 0;
      for (int64_t v = 0; v < vocab_; ++v) z += std::exp(double(row[v]) - m);
      return m + std::log(z);
    }();
    TokenId pick = -1;
    if (!constrained) {
      pick = 0;
      for (int64_t v = 1; v < tok_vocab_; ++v)
        if (row[v] > row[pick]) pick = static_cast<TokenId>(v);
    } else {
      masked.assign(row, row + tok_vocab_);
      s.con->mask(std::span<float>(masked.data(), masked.size()), kNoBudget);
      for (int64_t v = 0; v < tok_vocab_; ++v)
        if (masked[v] != -INFINITY && (pick < 0 || masked[v] > masked[pick])) pick = static_cast<TokenId>(v);
      if (pick < 0) {  // nothing can extend the output: it is as complete as it gets
        s.done = true;
        s.finish = s.con->complete() ? "stop" : "no_match";
        return;
      }
    }
    if (eos && pick == *eos) {
      s.done = true;
      s.finish = "stop";
      return;
    }
    s.out.push_back(pick);
    s.logprob += row[pick] - lse;
    s.text += tok_.token_bytes(pick);
    if (constrained) s.con->accept(pick);
    for (const auto& stop : spec_.stop) {
      const size_t at = s.text.find(stop);
      if (!stop.empty() && at != std::string::npos) {
        s.text.resize(at);
        s.done = true;
        s.finish = "stop";
        return;
      }
    }
    // A finished output (a choice no longer choice extends, a regex match nothing extends) needs
    // no EOS to end; at the token limit a regex output still ends "length", as it always has.
    if (constrained && s.con->finished() &&
        (!spec_.choices.empty() || static_cast<int64_t>(s.out.size()) < spec_.max_tokens)) {
      s.done = true;
      s.finish = "stop";
      return;
    }
    if (static_cast<int64_t>(s.out.size()) >= spec_.max_tokens) s.done = true;
  };

  prefill_last(docs, rows, [&](size_t i, const float* logits) { step(i, logits); });
  for (;;) {
    std::vector<std::vector<TokenId>> ids;
    std::vector<int64_t> live;
    std::vector<size_t> which;
    for (size_t i = 0; i < B; ++i)
      if (!st[i].done) {
        ids.push_back({st[i].out.back()});
        live.push_back(rows[i]);
        which.push_back(i);
      }
    if (ids.empty()) break;
    forward(ids, *cache_, live, [&](size_t k, const float* logits) { step(which[k], logits); });
  }
  for (size_t i = 0; i < B; ++i) {
    auto& r = docs[i]->result;
    r["text"] = st[i].text;
    r["logprob"] = st[i].logprob;
    r["tokens"] = static_cast<int64_t>(st[i].out.size());
    r["finish_reason"] = st[i].finish;
  }
}

}  // namespace corelm::pipeline
