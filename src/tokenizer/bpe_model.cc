#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include "corelm/error.h"

namespace corelm::tok {
namespace {

std::atomic<uint64_t> g_next_serial{1};

// Pre-token -> ids, per thread, for the pieces the vocabulary does not hold whole. Bounded: it is
// dropped and rebuilt when it grows past its budget.
struct PieceCache {
  uint64_t owner = 0;
  StringIdMap index;  // piece -> offset in ids (ids[offset] = count, then the ids)
  std::vector<int32_t> ids;
  void reset(uint64_t serial) {
    owner = serial;
    index = StringIdMap();
    ids.clear();
  }
};
constexpr size_t kCacheMaxPieceBytes = 64;

// A small direct-mapped cache in front of everything: English pre-tokens follow a steep Zipf
// curve, and the vocabulary table (megabytes) misses the L2 cache while this one (768 KiB) fits.
struct HotCache {
  static constexpr size_t kEntries = 16384;
  static constexpr size_t kMaxKey = 22, kMaxIds = 6;
  struct Entry {
    uint8_t len = 0xFF, nids = 0;
    char key[kMaxKey];
    int32_t ids[kMaxIds];
  };
  uint64_t owner = 0;
  Entry entries[kEntries];
  void reset(uint64_t serial) {
    owner = serial;
    for (Entry& e : entries) e.len = 0xFF;
  }
};
constexpr size_t kCacheMaxIds = size_t(1) << 22;

}  // namespace

BpeModel::BpeModel(std::vector<std::string> tokens, const std::vector<MergeRule>& merges, bool ignore_merges,
                   const std::string& source, int32_t unk_id, bool fuse_unk)
    : tokens_(std::move(tokens)), merge_rules_(merges), unk_id_(unk_id), fuse_unk_(fuse_unk),
      ignore_merges_(ignore_merges), merge_count_(merges.size()), serial_(g_next_serial++) {
  CORELM_CHECK(unk_id_ < static_cast<int64_t>(tokens_.size()) && (unk_id_ < 0 || !tokens_[unk_id_].empty()),
               FormatError, source, ": unknown token id ", unk_id_, " is not in the model vocabulary");
  vocab_.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty()) continue;
    vocab_.insert(tokens_[id], static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    byte_id_[b] = vocab_.find(std::string_view(&c, 1));
    missing_bytes_ += byte_id_[b] < 0;
  }
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r)
    merges_.insert(merges[r].left, merges[r].right, {static_cast<int32_t>(r), merges[r].merged});
  reachable_.reset(new std::atomic<uint8_t>[tokens_.size()]);
  for (size_t i = 0; i < tokens_.size(); ++i) reachable_[i].store(0, std::memory_order_relaxed);
}

size_t BpeModel::initial_symbols(std::string_view piece, int32_t* sym) const {
  size_t n = 0;
  bool after_unk = false;  // the previous byte was missing and became unk
  for (char c : piece) {
    int32_t id = byte_id_[static_cast<unsigned char>(c)];
    if (id < 0) {
      if (unk_id_ < 0 || (fuse_unk_ && after_unk)) continue;
      id = unk_id_;
      after_unk = true;
    } else {
      after_unk = false;
    }
    sym[n++] = id;
  }
  return n;
}

void BpeModel::merge_loop(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() <= 48) merge_small(piece, out);
  else merge_heap(piece, out);
}

// Short pieces: rescan for the lowest-ranked adjacent pair (leftmost on ties) and merge it. The
// quadratic rescan beats a heap below a few dozen symbols.
void BpeModel::merge_small(std::string_view piece, std::vector<int32_t>& out) const {
  int32_t sym[64];
  size_t n = missing_bytes_ ? initial_symbols(piece, sym) : piece.size();
  if (!missing_bytes_)
    for (size_t i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  while (n > 1) {
    int32_t best_rank = INT32_MAX, best_merged = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      const PairMap::Merge* m = merges_.find(sym[i], sym[i + 1]);
      if (m && m->rank < best_rank) { best_rank = m->rank; best_merged = m->merged; best = i; }
    }
    if (best_merged < 0) break;
    sym[best] = best_merged;
    for (size_t i = best + 1; i + 1 < n; ++i) sym[i] = sym[i + 1];
    --n;
  }
  out.insert(out.end(), sym, sym + n);
}

// Long pieces (e.g. a megabyte of one letter): a min-heap of candidate merges ordered by
// (rank, position) over a linked list of symbols; stale entries are skipped when popped.
void BpeModel::merge_heap(std::string_view piece, std::vector<int32_t>& out) const {
  struct Sym { int32_t id, prev, next; };
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> ids(piece.size());
  const size_t n = initial_symbols(piece, ids.data());
  if (n == 0) return;
  std::vector<Sym> sym(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] = {ids[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    int32_t next = sym[pos].next;
    if (next < 0) return;
    if (const PairMap::Merge* m = merges_.find(sym[pos].id, sym[next].id))
      heap.push({m->rank, pos, sym[pos].id, sym[next].id, m->merged});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& s = sym[c.pos];
    if (s.id != c.left || s.next < 0 || sym[s.next].id != c.right) continue;  // stale
    int32_t dead = s.next;
    s.id = c.merged;
    s.next = sym[dead].next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    sym[dead].id = -1;
    consider(s.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

bool BpeModel::reachable(int32_t id) const {
  uint8_t state = reachable_[id].load(std::memory_order_relaxed);
  if (state == 0) {
    std::vector<int32_t> ids;
    merge_loop(tokens_[id], ids);
    state = (ids.size() == 1 && ids[0] == id) ? 1 : 2;
    reachable_[id].store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    const int32_t id = byte_id_[static_cast<unsigned char>(piece[0])];
    if (id >= 0) out.push_back(id);
    else if (unk_id_ >= 0) out.push_back(unk_id_);
    return;
  }
  uint64_t h = hash_bytes(piece);
  if (piece.size() <= HotCache::kMaxKey) {
    // On the heap, not in static TLS: 768 KiB per thread would otherwise be reserved at the top of
    // every thread's stack in the process, tokenizing or not.
    thread_local std::unique_ptr<HotCache> hot_ptr;
    if (!hot_ptr) hot_ptr = std::make_unique<HotCache>();
    HotCache& hot = *hot_ptr;
    if (hot.owner != serial_) hot.reset(serial_);
    HotCache::Entry& e = hot.entries[(h >> 20) & (HotCache::kEntries - 1)];
    if (e.len == piece.size() && std::memcmp(e.key, piece.data(), piece.size()) == 0) {
      for (int i = 0; i < e.nids; ++i) out.push_back(e.ids[i]);  // a libc memmove call costs more
      return;
    }
    size_t start = out.size();
    encode_uncached(piece, h, out);
    size_t n = out.size() - start;
    if (n <= HotCache::kMaxIds) {
      e.len = static_cast<uint8_t>(piece.size());
      std::memcpy(e.key, piece.data(), piece.size());
      e.nids = static_cast<uint8_t>(n);
      std::copy(out.begin() + start, out.end(), e.ids);
    }
    return;
  }
  encode_uncached(piece, h, out);
}

void BpeModel::encode_uncached(std::string_view piece, uint64_t h, std::vector<int32_t>& out) const {
  // A whole pre-token that is a token: with ignore_merges (Llama 3) it is emitted as is; otherwise
  // only if the merges would rebuild it anyway, which holds for nearly every token and is
  // remembered per token, so the common case is one hash lookup.
  int32_t whole = vocab_.find_hashed(piece, h);
  if (whole >= 0 && (ignore_merges_ || reachable(whole))) {
    out.push_back(whole);
    return;
  }
  if (piece.size() > kCacheMaxPieceBytes) {
    merge_loop(piece, out);
    return;
  }
  thread_local PieceCache cache;
  if (cache.owner != serial_ || cache.ids.size() > kCacheMaxIds) cache.reset(serial_);
  int32_t off = cache.index.find(piece);
  if (off >= 0) {
    int32_t count = cache.ids[off];
    out.insert(out.end(), cache.ids.begin() + off + 1, cache.ids.begin() + off + 1 + count);
    return;
  }
  size_t start = out.size();
  merge_loop(piece, out);
  cache.index.insert(piece, static_cast<int32_t>(cache.ids.size()));
  cache.ids.push_back(static_cast<int32_t>(out.size() - start));
  cache.ids.insert(cache.ids.end(), out.begin() + start, out.end());
}

}  // namespace corelm::tok
