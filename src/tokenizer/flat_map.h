// Open-addressing hash tables for the encode hot path: byte strings -> id (vocabulary lookups of
// whole pre-tokens) and id pairs -> merge (BPE). std::unordered_map costs a node allocation and a
// pointer chase per entry; these keep keys inline or in one arena and probe linearly.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace corelm::tok {

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xff51afd7ed558ccdull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0x94d049bb133111ebull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

inline uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Byte string -> int32 value. Keys are copied into an arena; insert keeps the first value.
class StringIdMap {
 public:
  void reserve(size_t n) { rehash(capacity_for(n)); }
  size_t size() const { return size_; }

  // Returns false (and leaves the old value) if the key is already present.
  bool insert(std::string_view key, int32_t value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) rehash(slots_.empty() ? 64 : slots_.size() * 2);
    uint64_t h = hash_bytes(key);
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s.hash = h;
        s.offset = static_cast<uint32_t>(arena_.size());
        s.len = static_cast<uint32_t>(key.size());
        s.value = value;
        arena_.append(key);
        ++size_;
        return true;
      }
      if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)
        return false;
    }
  }

  // Value of key, or -1.
  int32_t find(std::string_view key) const { return find_hashed(key, hash_bytes(key)); }
  int32_t find_hashed(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return -1;
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return -1;
      if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)
        return s.value;
    }
  }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t len = kEmpty;
    int32_t value = 0;
  };
  static size_t capacity_for(size_t n) {
    size_t c = 64;
    while (c * 3 < n * 4 + 4) c *= 2;
    return c;
  }
  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    size_t mask = capacity - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// (left id, right id) -> (rank, merged id).
class PairMap {
 public:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  void reserve(size_t n) {
    size_t c = 64;
    while (c * 3 < n * 4 + 4) c *= 2;
    keys_.assign(c, kEmpty);
    values_.assign(c, Merge{-1, -1});
  }
  // Keeps the first (lowest-rank) entry for a pair.
  bool insert(int32_t a, int32_t b, Merge m) {
    uint64_t key = pack(a, b);
    size_t mask = keys_.size() - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == kEmpty) { keys_[i] = key; values_[i] = m; return true; }
      if (keys_[i] == key) return false;
    }
  }
  const Merge* find(int32_t a, int32_t b) const {
    uint64_t key = pack(a, b);
    size_t mask = keys_.size() - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
};

}  // namespace corelm::tok
