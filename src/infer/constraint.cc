// TokenConstraint: a grammar state applied to a vocabulary. The vocabulary is indexed once per
// tokenizer as a byte trie; mask() walks it depth first from the current state, stepping the state
// one byte per trie edge and skipping every subtree whose prefix is already dead, so tokens that
// share a prefix share its work. The set of live tokens depends on the state alone, so it is
// cached per state key (shared by clones), together with the order of those tokens by the
// completion length they leave, from which the budget filter (forcing completion) is a prefix.
#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "corelm/constraint.h"
#include "corelm/error.h"
#include "infer/constraint_impl.h"

namespace corelm::infer {
namespace constraint {
namespace {

// Tokens longer than this never take part (no real vocabulary has them; it bounds the walk depth).
constexpr size_t kMaxTokenBytes = 1024;
// Forcing starts this many tokens before the budget could no longer cover the shortest completion.
constexpr int64_t kForceMargin = 2;

uint64_t fingerprint_of(const Tokenizer& tok) {
  // Enough to tell two tokenizers at one address apart (the cache is keyed by address).
  uint64_t h = 1469598103934665603ull ^ tok.vocab_size();
  const size_t v = tok.vocab_size();
  for (size_t k = 0; k < 64 && v; ++k) {
    const TokenId id = static_cast<TokenId>((k * 2654435761u) % v);
    for (unsigned char c : tok.token_bytes(id)) h = (h ^ c) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(tok.is_special(id))) * 1099511628211ull;
  }
  return h;
}

std::shared_ptr<const VocabIndex> build_index(const Tokenizer& tok) {
  auto ix = std::make_shared<VocabIndex>();
  ix->vocab = tok.vocab_size();
  ix->fingerprint = fingerprint_of(tok);
  ix->special.assign(ix->vocab, 0);
  std::vector<std::pair<std::string_view, TokenId>> items;
  items.reserve(ix->vocab);
  for (size_t i = 0; i < ix->vocab; ++i) {
    const TokenId id = static_cast<TokenId>(i);
    if (tok.is_special(id)) {
      ix->special[i] = 1;
      continue;
    }
    std::string_view b = tok.token_bytes(id);
    if (b.empty() || b.size() > kMaxTokenBytes) continue;
    items.emplace_back(b, id);
    ix->depth = std::max(ix->depth, b.size());
  }
  std::sort(items.begin(), items.end());
  // Node of items[lo, hi) sharing their first `d` bytes; a node's edges are contiguous.
  auto build = [&](auto& self, size_t lo, size_t hi, size_t d) -> uint32_t {
    const uint32_t me = static_cast<uint32_t>(ix->nodes.size());
    ix->nodes.emplace_back();
    ix->nodes[me].tok_begin = static_cast<uint32_t>(ix->toks.size());
    while (lo < hi && items[lo].first.size() == d) ix->toks.push_back(items[lo++].second);
    ix->nodes[me].tok_end = static_cast<uint32_t>(ix->toks.size());
    std::vector<std::pair<size_t, size_t>> groups;
    for (size_t i = lo; i < hi;) {
      size_t j = i;
      while (j < hi && items[j].first[d] == items[i].first[d]) ++j;
      groups.emplace_back(i, j);
      i = j;
    }
    const uint32_t eb = static_cast<uint32_t>(ix->edge_byte.size());
    ix->nodes[me].edge_begin = eb;
    ix->nodes[me].edge_end = eb + static_cast<uint32_t>(groups.size());
    for (const auto& g : groups) {
      ix->edge_byte.push_back(static_cast<unsigned char>(items[g.first].first[d]));
      ix->edge_child.push_back(0);
    }
    for (size_t k = 0; k < groups.size(); ++k) ix->edge_child[eb + k] = self(self, groups[k].first, groups[k].second, d + 1);
    return me;
  };
  build(build, 0, items.size(), 0);
  return ix;
}

// The indexes of the last few tokenizers stay alive even when no constraint uses them (a server
// creates one constraint per request; rebuilding the trie each time would cost milliseconds).
std::shared_ptr<const VocabIndex> index_for(const Tokenizer& tok) {
  constexpr size_t kKeep = 8;
  static std::mutex mu;
  static std::vector<std::pair<const Tokenizer*, std::shared_ptr<const VocabIndex>>> recent;  // newest last
  const uint64_t fp = fingerprint_of(tok);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < recent.size(); ++i)
      if (recent[i].first == &tok && recent[i].second->vocab == tok.vocab_size() && recent[i].second->fingerprint == fp) {
        auto hit = recent[i];
        recent.erase(recent.begin() + static_cast<std::ptrdiff_t>(i));
        recent.push_back(hit);
        return hit.second;
      }
  }
  // Built outside the lock (it takes a while on a large vocabulary); two threads racing build
  // it twice, harmlessly.
  auto ix = build_index(tok);
  std::lock_guard<std::mutex> lock(mu);
  std::erase_if(recent, [&](const auto& e) { return e.first == &tok; });
  recent.emplace_back(&tok, ix);
  if (recent.size() > kKeep) recent.erase(recent.begin());
  return ix;
}

// A state of a grammar that is not one of ours, behind the StateImpl interface (never cached).
class ForeignState final : public StateImpl {
 public:
  explicit ForeignState(std::unique_ptr<GrammarState> s) : s_(std::move(s)) {}
  std::unique_ptr<GrammarState> clone() const override { return std::make_unique<ForeignState>(s_->clone()); }
  void assign_from(const StateImpl& o) override { s_ = static_cast<const ForeignState&>(o).s_->clone(); }
  bool step(unsigned char b) override {
    const char c = static_cast<char>(b);
    return s_->advance(std::string_view(&c, 1));
  }
  bool advance(std::string_view bytes) override { return s_->advance(bytes); }
  bool accepts() const override { return s_->accepts(); }
  bool can_continue() const override { return s_->can_continue(); }
  int64_t min_bytes_to_accept() const override { return s_->min_bytes_to_accept(); }
  void next_bytes(bool out[256]) const override { s_->next_bytes(out); }
  bool cheap_next_bytes() const override { return true; }
  void key(std::string& out) const override { out.clear(); }

 private:
  std::unique_ptr<GrammarState> s_;
};

std::unique_ptr<StateImpl> as_impl(std::unique_ptr<GrammarState> s) {
  if (auto* p = dynamic_cast<StateImpl*>(s.get())) {
    s.release();
    return std::unique_ptr<StateImpl>(p);
  }
  return std::make_unique<ForeignState>(std::move(s));
}

struct MaskEntry {
  std::vector<uint64_t> bits;  // live tokens (trie tokens only: no special, no EOS decision)
  // The same tokens ordered by min_bytes_to_accept after them, so the budget filter is a prefix.
  std::vector<std::pair<int32_t, TokenId>> by_after;
  int64_t max_after() const { return by_after.empty() ? 0 : by_after.back().first; }
};

struct MaskCache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const MaskEntry>> map;
  size_t bytes = 0;  // nothing more is cached past kMaxBytes
  static constexpr size_t kMaxBytes = size_t{64} << 20;
};

}  // namespace

void walk_generic(const StateImpl& root, const VocabIndex& ix, void* ctx, TokenSink sink) {
  std::vector<std::unique_ptr<StateImpl>> st(ix.depth + 1);
  for (auto& s : st) s = as_impl(root.clone());
  walk_stack([&st](size_t d) -> StateImpl& { return *st[d]; }, ix, ctx, sink);
}

}  // namespace constraint

using constraint::MaskCache;
using constraint::MaskEntry;
using constraint::StateImpl;
using constraint::VocabIndex;

struct TokenConstraint::Impl {
  std::shared_ptr<const Grammar> grammar;
  const Tokenizer* tok = nullptr;
  std::shared_ptr<const VocabIndex> ix;
  std::vector<TokenId> eos;  // sorted, unique, in range
  std::unique_ptr<StateImpl> state;
  std::shared_ptr<MaskCache> cache;
  bool ended = false;  // an EOS id was accepted
  std::unique_ptr<StateImpl> tmp;  // accept() steps a copy, so a refused token changes nothing

  bool is_eos(TokenId t) const { return std::binary_search(eos.begin(), eos.end(), t); }
  bool complete() const { return ended || state->accepts(); }

  // Calls on_token(token, min_bytes_to_accept after it) for every trie token whose bytes keep
  // the state alive (EOS ids excluded: they are decided by complete()).
  template <class F>
  void for_live_tokens(F&& on_token) const {
    struct Ctx {
      const Impl* self;
      F* f;
    } ctx{this, &on_token};
    state->walk(*ix, &ctx, [](void* c, TokenId t, int64_t after) {
      auto* x = static_cast<Ctx*>(c);
      if (!x->self->is_eos(t)) (*x->f)(t, after);
    });
  }

  std::shared_ptr<const MaskEntry> live_mask() const {
    std::string key;
    state->key(key);
    if (!key.empty()) {
      std::lock_guard<std::mutex> lock(cache->mu);
      auto it = cache->map.find(key);
      if (it != cache->map.end()) return it->second;
    }
    auto e = std::make_shared<MaskEntry>();
    e->bits.assign((ix->vocab + 63) / 64, 0);
    std::vector<std::pair<int32_t, TokenId>> raw;
    int32_t top = 0;
    for_live_tokens([&](TokenId t, int64_t after) {
      e->bits[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
      const int32_t a = static_cast<int32_t>(std::clamp<int64_t>(after, 0, INT32_MAX - 1));
      raw.emplace_back(a, t);
      top = std::max(top, a);
    });
    if (top < (1 << 16)) {  // counting sort: the lengths are small
      std::vector<uint32_t> start(static_cast<size_t>(top) + 2, 0);
      for (const auto& p : raw) ++start[static_cast<size_t>(p.first) + 1];
      for (size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
      e->by_after.resize(raw.size());
      for (const auto& p : raw) e->by_after[start[static_cast<size_t>(p.first)]++] = p;
    } else {
      std::sort(raw.begin(), raw.end());
      e->by_after = std::move(raw);
    }
    if (!key.empty()) {
      std::lock_guard<std::mutex> lock(cache->mu);
      const size_t b = e->bits.size() * 8 + e->by_after.size() * sizeof(e->by_after[0]) + key.size() + 64;
      if (cache->bytes + b <= MaskCache::kMaxBytes && cache->map.emplace(std::move(key), e).second) cache->bytes += b;
    }
    return e;
  }
};

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, const Tokenizer& tokenizer,
                                 std::vector<TokenId> eos_ids)
    : impl_(std::make_unique<Impl>()) {
  CORELM_CHECK(grammar != nullptr, ValueError, "TokenConstraint: no grammar");
  impl_->grammar = std::move(grammar);
  impl_->tok = &tokenizer;
  impl_->ix = constraint::index_for(tokenizer);
  if (tokenizer.eos_id()) eos_ids.push_back(*tokenizer.eos_id());
  for (TokenId t : eos_ids)
    if (t >= 0 && static_cast<size_t>(t) < impl_->ix->vocab) impl_->eos.push_back(t);
  std::sort(impl_->eos.begin(), impl_->eos.end());
  impl_->eos.erase(std::unique(impl_->eos.begin(), impl_->eos.end()), impl_->eos.end());
  impl_->state = constraint::as_impl(impl_->grammar->start());
  impl_->cache = std::make_shared<MaskCache>();
}

TokenConstraint::~TokenConstraint() = default;
TokenConstraint::TokenConstraint(TokenConstraint&&) noexcept = default;
TokenConstraint& TokenConstraint::operator=(TokenConstraint&&) noexcept = default;

TokenConstraint TokenConstraint::clone() const {
  // The public constructor finds the cached index; then the state, cache and end flag are copied.
  TokenConstraint c(impl_->grammar, *impl_->tok, impl_->eos);
  c.impl_->state = constraint::as_impl(impl_->state->clone());
  c.impl_->cache = impl_->cache;
  c.impl_->ended = impl_->ended;
  return c;
}

void TokenConstraint::mask(std::span<float> logits, int64_t remaining_tokens) const {
  const Impl& m = *impl_;
  const float ninf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), m.ix->vocab);
  for (size_t t = n; t < logits.size(); ++t) logits[t] = ninf;
  const bool complete = m.complete();
  auto keep_eos_only = [&] {
    for (size_t t = 0; t < n; ++t)
      if (!(complete && !m.ended && m.is_eos(static_cast<TokenId>(t)))) logits[t] = ninf;
  };
  if (m.ended || !m.state->can_continue()) return keep_eos_only();

  const int64_t left = std::max<int64_t>(1, remaining_tokens) - 1;  // tokens after this one
  const int64_t need = m.state->min_bytes_to_accept();
  const bool forcing = need <= INT64_MAX - constraint::kForceMargin && left + 1 <= need + constraint::kForceMargin;
  auto live = m.live_mask();
  const std::vector<uint64_t>* bits = &live->bits;
  std::vector<uint64_t> filtered;
  if (forcing || live->max_after() > left) {
    // Budget filter: every kept token leaves a completion that fits in the tokens left (with one
    // token per byte at worst), and under forcing it must bring the completion strictly closer.
    filtered.assign(live->bits.size(), 0);
    const auto* by_after = &live->by_after;
    const int64_t bound = forcing ? std::min(left, need - 1) : left;
    auto set = [&](TokenId t) { filtered[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63); };
    size_t k = 0;
    for (; k < by_after->size() && (*by_after)[k].first <= bound; ++k) set((*by_after)[k].second);
    if (k == 0 && !(complete && !m.eos.empty()) && !by_after->empty()) {
      // Nothing fits (a budget shorter than the shortest completion, or a vocabulary without
      // single-byte tokens): best effort, the tokens that get closest.
      for (size_t j = 0; j < by_after->size() && (*by_after)[j].first == by_after->front().first; ++j)
        set((*by_after)[j].second);
    }
    bits = &filtered;
  }
  // Word by word over the bit set: only the removed tokens are touched.
  std::vector<std::pair<TokenId, float>> eos_keep;
  if (complete)
    for (TokenId t : m.eos)
      if (static_cast<size_t>(t) < n) eos_keep.emplace_back(t, logits[t]);
  for (size_t w = 0; w * 64 < n; ++w) {
    uint64_t off = ~(*bits)[w];
    if (w * 64 + 64 > n) off &= (uint64_t{1} << (n - w * 64)) - 1;
    if (off == ~uint64_t{0}) {
      std::fill(logits.begin() + static_cast<std::ptrdiff_t>(w * 64), logits.begin() + static_cast<std::ptrdiff_t>(w * 64 + 64), ninf);
      continue;
    }
    while (off) {
      logits[w * 64 + static_cast<size_t>(__builtin_ctzll(off))] = ninf;
      off &= off - 1;
    }
  }
  for (const auto& [t, v] : eos_keep) logits[t] = v;
}

void TokenConstraint::accept(TokenId token) {
  Impl& m = *impl_;
  CORELM_CHECK(!m.ended, ValueError, "constraint: token ", token, " after the end of the output");
  CORELM_CHECK(token >= 0 && static_cast<size_t>(token) < m.ix->vocab, ValueError, "constraint: token id ", token,
               " outside the vocabulary of ", m.ix->vocab);
  if (m.is_eos(token)) {
    CORELM_CHECK(m.state->accepts(), ValueError, "constraint: end of sequence before the output is complete (",
                 m.grammar->describe(), ")");
    m.ended = true;
    return;
  }
  CORELM_CHECK(!m.ix->special[static_cast<size_t>(token)], ValueError, "constraint: special token ", token,
               " is never allowed");
  const std::string_view bytes = m.tok->token_bytes(token);
  CORELM_CHECK(!bytes.empty() && bytes.size() <= constraint::kMaxTokenBytes, ValueError, "constraint: token ", token,
               " has no bytes to match");
  if (!m.tmp) m.tmp = constraint::as_impl(m.state->clone());
  m.tmp->assign_from(*m.state);
  CORELM_CHECK(m.tmp->advance(bytes), ValueError, "constraint: token ", token, " cannot continue the output (",
               m.grammar->describe(), ")");
  std::swap(m.state, m.tmp);
}

bool TokenConstraint::complete() const { return impl_->complete(); }
bool TokenConstraint::finished() const {
  return impl_->ended || (impl_->state->accepts() && !impl_->state->can_continue());
}

}  // namespace corelm::infer
