// Hashing for `corelm data build`: a fixed 64-bit byte hash (the same on every machine, unlike
// std::hash, so builds are reproducible), MinHash signatures with LSH band keys, and two flat
// open-addressing tables that keep memory at 8 bytes a slot for millions of paragraphs.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace corelm::pipeline {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t hash_bytes(std::string_view s, uint64_t seed) {
  uint64_t h = seed ^ (s.size() * 0x9fb21c651e98df25ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = mix64(h ^ w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  return mix64(h ^ tail ^ 0xff51afd7ed558ccdull);
}

// A uniform number in [0, 1) from a hash and a salt (split and sample decisions).
inline double unit_interval(uint64_t h, uint64_t salt) { return static_cast<double>(mix64(h ^ salt) >> 11) * 0x1p-53; }

constexpr int kBands = 10, kRows = 5, kMinHashes = kBands * kRows;
using BandKeys = std::array<uint64_t, kBands>;

// Band keys of the MinHash signature of a shingle set: hash i is (a_i * x + b_i) >> 32 over the
// shingle hashes x (a_i odd), the minimum over the set; band b hashes rows 5b..5b+4.
inline BandKeys band_keys(const std::vector<uint64_t>& shingles) {
  static const auto coef = [] {
    std::array<std::pair<uint64_t, uint64_t>, kMinHashes> c{};
    uint64_t s = 0x243f6a8885a308d3ull;
    for (auto& [a, b] : c) {
      a = mix64(s += 0x9e3779b97f4a7c15ull) | 1;
      b = mix64(s += 0x9e3779b97f4a7c15ull);
    }
    return c;
  }();
  std::array<uint32_t, kMinHashes> sig;
  sig.fill(0xffffffffu);
  for (uint64_t x : shingles)
    for (int i = 0; i < kMinHashes; ++i) {
      const uint32_t v = static_cast<uint32_t>((coef[i].first * x + coef[i].second) >> 32);
      sig[i] = v < sig[i] ? v : sig[i];
    }
  BandKeys keys{};
  for (int b = 0; b < kBands; ++b) {
    uint64_t h = 0x7a3b9e1c5d2f4a61ull + static_cast<uint64_t>(b);
    for (int r = 0; r < kRows; ++r) h = mix64(h ^ sig[b * kRows + r]);
    keys[b] = h;
  }
  return keys;
}

// Set of 64-bit keys (exact: the exact-duplicate test must never drop a paragraph by accident).
class U64Set {
 public:
  U64Set() : slots_(1 << 16, 0) {}
  bool insert(uint64_t key) {  // false when present
    if (key == 0) key = 0x8000000000000001ull;  // 0 marks an empty slot
    if ((size_ + 1) * 2 > slots_.size()) grow();
    if (!place(slots_, key)) return false;
    ++size_;
    return true;
  }
  size_t bytes() const { return slots_.size() * 8; }

 private:
  static bool place(std::vector<uint64_t>& t, uint64_t key) {
    const size_t mask = t.size() - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
      if (t[i] == key) return false;
      if (t[i] == 0) {
        t[i] = key;
        return true;
      }
    }
  }
  void grow() {
    std::vector<uint64_t> t(slots_.size() * 2, 0);
    for (uint64_t k : slots_)
      if (k) place(t, k);
    slots_.swap(t);
  }
  std::vector<uint64_t> slots_;
  size_t size_ = 0;
};

// Band bucket -> the first kept paragraph in it. A slot holds a 32-bit fingerprint of the key
// (which also picks the slot, so the table can grow without the keys) and the paragraph index + 1.
// Two keys with one fingerprint only yield a spurious candidate, which the exact Jaccard check
// rejects (about N / 2^32 per lookup for N stored buckets).
class BandTable {
 public:
  BandTable() : slots_(1 << 16, 0) {}
  // The paragraph in key's bucket, or -1.
  int64_t find(uint64_t key) const {
    const uint64_t fp = fingerprint(key);
    const size_t mask = slots_.size() - 1;
    for (size_t i = mix64(fp) & mask;; i = (i + 1) & mask) {
      if (slots_[i] == 0) return -1;
      if ((slots_[i] >> 32) == fp) return static_cast<int64_t>(slots_[i] & 0xffffffffu) - 1;
    }
  }
  void insert_if_absent(uint64_t key, uint32_t paragraph) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    if (place(slots_, (fingerprint(key) << 32) | (paragraph + 1ull))) ++size_;
  }
  size_t bytes() const { return slots_.size() * 8; }

 private:
  static uint64_t fingerprint(uint64_t key) { return (key >> 32) | 1; }  // never 0
  static bool place(std::vector<uint64_t>& t, uint64_t slot) {
    const size_t mask = t.size() - 1;
    for (size_t i = mix64(slot >> 32) & mask;; i = (i + 1) & mask) {
      if (t[i] == 0) {
        t[i] = slot;
        return true;
      }
      if ((t[i] >> 32) == (slot >> 32)) return false;
    }
  }
  void grow() {
    std::vector<uint64_t> t(slots_.size() * 2, 0);
    for (uint64_t s : slots_)
      if (s) place(t, s);
    slots_.swap(t);
  }
  std::vector<uint64_t> slots_;
  size_t size_ = 0;
};

}  // namespace corelm::pipeline
