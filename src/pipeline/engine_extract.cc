// The extract task: greedy decoding per document, optionally constrained to a list of choices or a
// regex. Constraints pick the most likely token among those that keep the output completable;
// EOS is allowed once the output is complete. Stop strings cut the text where they begin.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "corelm/error.h"
#include "pipeline/engine.h"

namespace corelm::pipeline {
namespace {

struct DecodeRow {
  std::vector<TokenId> out;
  std::string text;
  double logprob = 0;
  Regex::State re;
  bool done = false;
  std::string finish = "length";
};

bool is_prefix_of_some(const std::string& s, const std::vector<std::string>& choices) {
  for (const auto& c : choices)
    if (c.size() >= s.size() && c.compare(0, s.size(), s) == 0) return true;
  return false;
}

}  // namespace

void Engine::extract(const std::vector<PreparedDoc*>& docs) {
  const size_t B = docs.size();
  std::vector<int64_t> rows(B);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<DecodeRow> st(B);
  if (regex_)
    for (auto& s : st) s.re = regex_->start();
  const std::optional<TokenId> eos = tok_.eos_id();
  const bool constrained = regex_.has_value() || !spec_.choices.empty();

  auto complete = [&](const DecodeRow& s) {
    if (regex_) return regex_->accepts(s.re);
    if (!spec_.choices.empty())
      return std::find(spec_.choices.begin(), spec_.choices.end(), s.text) != spec_.choices.end();
    return true;
  };
  auto allowed = [&](const DecodeRow& s, TokenId t, Regex::State* next_re) {
    if (eos && t == *eos) return complete(s);
    if (!constrained) return true;
    if (tok_.is_special(t)) return false;
    const std::string_view piece = tok_.token_bytes(t);
    if (piece.empty()) return false;
    if (regex_) {
      Regex::State r = s.re;
      if (!regex_->advance(r, piece)) return false;
      if (next_re) *next_re = std::move(r);
      return true;
    }
    return is_prefix_of_some(s.text + std::string(piece), spec_.choices);
  };
  // One decoding step of row i from its logits.
  std::vector<int32_t> order(static_cast<size_t>(tok_vocab_));
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
    Regex::State next_re;
    if (!constrained) {
      pick = 0;
      for (int64_t v = 1; v < tok_vocab_; ++v)
        if (row[v] > row[pick]) pick = static_cast<TokenId>(v);
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      for (int32_t v : order)
        if (allowed(s, v, &next_re)) {
          pick = v;
          break;
        }
      if (pick < 0) {  // nothing can extend the output: it is as complete as it gets
        s.done = true;
        s.finish = complete(s) ? "stop" : "no_match";
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
    if (regex_) s.re = std::move(next_re);
    for (const auto& stop : spec_.stop) {
      const size_t at = s.text.find(stop);
      if (!stop.empty() && at != std::string::npos) {
        s.text.resize(at);
        s.done = true;
        s.finish = "stop";
        return;
      }
    }
    // A finished choice that no longer choice extends needs no EOS to end.
    if (!spec_.choices.empty() && complete(s) && !std::any_of(spec_.choices.begin(), spec_.choices.end(), [&](const auto& c) {
          return c.size() > s.text.size() && c.compare(0, s.text.size(), s.text) == 0;
        })) {
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
