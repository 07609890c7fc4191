// KVCache: one buffer per layer for keys and one for values (f32 [B, Hkv, capacity, D], or u8
// [B, Hkv, capacity, row bytes] of encoded head vectors for the other KVCacheTypes), allocated
// once up front (no allocation per decoded token), plus each row's filled length. Callers size
// the capacity by what a request can reach (generate: prompt + max new tokens, bounded by the
// context), never by the model's context alone: a 2^31-token context is a config value, not
// memory anybody has.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/out_of_memory.h"
#include "ops/kv_codec.h"

namespace corelm::model {

namespace {
std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1 << 20));
  return buf;
}
}  // namespace

namespace {
ops::KVFormat format_of(KVCacheType t) { return static_cast<ops::KVFormat>(static_cast<int>(t)); }
static_assert(static_cast<int>(KVCacheType::Turbo3) == static_cast<int>(ops::KVFormat::Turbo3) &&
                  static_cast<int>(KVCacheType::Q8_0) == static_cast<int>(ops::KVFormat::Q8_0),
              "KVCacheType and ops::KVFormat list the same formats in the same order");

// A type the head_dim does not fit is named with the config field (kv_row_bytes says why).
int64_t row_bytes_of(KVCacheType t, int64_t d, const char* side) {
  try {
    return ops::kv_row_bytes(format_of(t), d);
  } catch (const ValueError& e) {
    throw ValueError(detail::concat("KVCache: ", side, " type ", kv_cache_type_name(t), ": ", e.what(),
                                    " (config field head_dim)"));
  }
}
}  // namespace

KVCache::KVCache(const ModelConfig& config, int64_t batch, int64_t capacity, KVCacheTypes types)
    : capacity_(capacity), types_(types) {
  config.validate();
  CORELM_CHECK(batch > 0, ValueError, "KVCache: batch must be positive, got ", batch);
  CORELM_CHECK(capacity > 0, ValueError, "KVCache: capacity must be positive, got ", capacity);
  const int64_t d = config.head_dim == 0 ? config.hidden_size / config.num_attention_heads : config.head_dim;
  head_dim_ = d;
  k_row_bytes_ = row_bytes_of(types.k, d, "key");
  v_row_bytes_ = row_bytes_of(types.v, d, "value");
  kv_heads_ = config.num_key_value_heads;
  const int64_t L = config.num_hidden_layers, Hkv = kv_heads_;
  // In double: the product of a hostile config's sizes may not fit an int64.
  double total = 0;
  for (int64_t l = 0; l < L; ++l) {
    const LayerSpec spec = config.layer(l);
    kinds_.push_back(spec.attention);
    all_full_ = all_full_ && spec.attention == AttentionKind::Full;
    if (spec.attention == AttentionKind::Full)
      total += double(batch) * double(Hkv) * double(capacity) * double(k_row_bytes_ + v_row_bytes_);
    else if (spec.attention == AttentionKind::Sliding)
      total += double(batch) * double(Hkv) * double(spec.window + 1 + kRingChunk) * double(2 * d * 4);
    else
      total += double(batch) * double(Hkv) * double(spec.d_state) * double(d * 4);
  }
  const auto what = [&] {
    return detail::concat("a KV cache of ", batch, " rows x ", capacity, " positions x ", config.num_hidden_layers,
                          " layers (", config.num_key_value_heads, " kv heads x ", d, " dims, ",
                          kv_cache_type_name(types.k), " keys and ", kv_cache_type_name(types.v), " values)");
  };
  // Past this no allocation can succeed, and the byte counts would not fit a size_t.
  CORELM_CHECK(total <= double(size_t{1} << 62), ValueError, what(), " needs ", mib(total),
               ": more than memory can address");
  lengths_.assign(static_cast<size_t>(batch), 0);
  const Shape f32_shape{batch, Hkv, capacity, d};
  auto buffer = [&](KVCacheType t, int64_t row_bytes) {
    if (t == KVCacheType::F32) return Tensor::zeros(f32_shape);
    return Tensor::zeros({batch, Hkv, capacity, row_bytes}, DType::U8);
  };
  try {
    for (int64_t l = 0; l < L; ++l) {
      const LayerSpec spec = config.layer(l);
      if (spec.attention == AttentionKind::Full) {
        k_.push_back(buffer(types.k, k_row_bytes_));
        v_.push_back(buffer(types.v, v_row_bytes_));
        state_.emplace_back();
      } else if (spec.attention == AttentionKind::Sliding) {
        k_.push_back(Tensor::zeros({batch, Hkv, spec.window + 1 + kRingChunk, d}));
        v_.push_back(Tensor::zeros({batch, Hkv, spec.window + 1 + kRingChunk, d}));
        state_.emplace_back();
      } else {
        k_.emplace_back();
        v_.emplace_back();
        state_.push_back(Tensor::zeros({batch, Hkv, spec.d_state, d}));
      }
    }
  } catch (const OutOfMemoryError&) {
    throw OutOfMemoryError(static_cast<size_t>(total), what());  // the whole cache, not the one layer that failed
  }
}

int64_t KVCache::ring_size(int64_t layer) const {
  CORELM_CHECK(layer_kind(layer) == AttentionKind::Sliding, ValueError, "KVCache::ring_size: layer ", layer, " is ",
               attention_kind_name(layer_kind(layer)));
  return k_[static_cast<size_t>(layer)].size(2);
}

Tensor& KVCache::ring_k(int64_t layer) {
  (void)ring_size(layer);
  return k_[static_cast<size_t>(layer)];
}

Tensor& KVCache::ring_v(int64_t layer) {
  (void)ring_size(layer);
  return v_[static_cast<size_t>(layer)];
}

Tensor& KVCache::state(int64_t layer) {
  CORELM_CHECK(layer_kind(layer) == AttentionKind::Linear, ValueError, "KVCache::state: layer ", layer, " is ",
               attention_kind_name(layer_kind(layer)));
  return state_[static_cast<size_t>(layer)];
}

bool KVCache::supports_prefix_blocks() const { return all_full_; }

int64_t KVCache::fixed_bytes_per_row() const {
  int64_t n = 0;
  for (size_t l = 0; l < kinds_.size(); ++l) {
    if (kinds_[l] == AttentionKind::Sliding) n += 2 * (k_[l].numel() / k_[l].size(0)) * 4;
    if (kinds_[l] == AttentionKind::Linear) n += (state_[l].numel() / state_[l].size(0)) * 4;
  }
  return n;
}

Tensor& KVCache::k(int64_t layer) {
  CORELM_CHECK(layer_kind(layer) == AttentionKind::Full, ValueError, "KVCache::k: layer ", layer, " is ",
               attention_kind_name(layer_kind(layer)), " (use ring_k / state)");
  CORELM_CHECK(types_.k == KVCacheType::F32, ValueError, "KVCache::k: the keys are stored as ",
               kv_cache_type_name(types_.k), ", not f32 (use k_bytes / load_keys)");
  return k_.at(layer);
}

Tensor& KVCache::v(int64_t layer) {
  CORELM_CHECK(layer_kind(layer) == AttentionKind::Full, ValueError, "KVCache::v: layer ", layer, " is ",
               attention_kind_name(layer_kind(layer)), " (use ring_v / state)");
  CORELM_CHECK(types_.v == KVCacheType::F32, ValueError, "KVCache::v: the values are stored as ",
               kv_cache_type_name(types_.v), ", not f32 (use v_bytes / load_values)");
  return v_.at(layer);
}

int64_t KVCache::bytes_per_token() const {
  int64_t full = 0;
  for (AttentionKind k : kinds_) full += k == AttentionKind::Full;
  return full * kv_heads_ * (k_row_bytes_ + v_row_bytes_);
}

namespace {
// Byte offset of position `pos` of kv head h of `row` in a [B, Hkv, cap, *] buffer.
int64_t entry_offset(const Tensor& t, int64_t row, int64_t h, int64_t pos, int64_t row_bytes) {
  return ((row * t.size(1) + h) * t.size(2) + pos) * row_bytes;
}
}  // namespace

void KVCache::store_keys(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, const float* x) {
  Tensor& t = k_.at(layer);
  auto* base = static_cast<uint8_t*>(t.raw_data());
  for (int64_t p = 0; p < count; ++p)
    ops::kv_encode_row(format_of(types_.k), x + p * head_dim_, head_dim_,
                           base + entry_offset(t, row, head, begin + p, k_row_bytes_));
}

void KVCache::store_values(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, const float* x) {
  Tensor& t = v_.at(layer);
  auto* base = static_cast<uint8_t*>(t.raw_data());
  for (int64_t p = 0; p < count; ++p)
    ops::kv_encode_row(format_of(types_.v), x + p * head_dim_, head_dim_,
                           base + entry_offset(t, row, head, begin + p, v_row_bytes_));
}

void KVCache::load_keys(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, float* x) const {
  const Tensor& t = k_.at(layer);
  const auto* base = static_cast<const uint8_t*>(t.raw_data());
  for (int64_t p = 0; p < count; ++p)
    ops::kv_decode_row(format_of(types_.k), base + entry_offset(t, row, head, begin + p, k_row_bytes_), head_dim_,
                           x + p * head_dim_);
}

void KVCache::load_values(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, float* x) const {
  const Tensor& t = v_.at(layer);
  const auto* base = static_cast<const uint8_t*>(t.raw_data());
  for (int64_t p = 0; p < count; ++p)
    ops::kv_decode_row(format_of(types_.v), base + entry_offset(t, row, head, begin + p, v_row_bytes_), head_dim_,
                           x + p * head_dim_);
}

void KVCache::set_length(int64_t row, int64_t len) {
  CORELM_CHECK(row >= 0 && row < batch(), IndexError, "KVCache: row ", row, " out of range for a batch of ", batch());
  CORELM_CHECK(len >= 0 && len <= capacity_, ValueError, "KVCache: length ", len, " outside [0, ", capacity_, "]");
  const int64_t old = lengths_[static_cast<size_t>(row)];
  CORELM_CHECK(all_full_ || len == 0 || len >= old, ValueError, "KVCache: row ", row, " holds ", old,
               " positions; a cache with sliding-window rings or linear-attention states cannot be rewound to ", len,
               " (only to 0)");
  if (len == 0 && !all_full_) {
    // Start afresh: the forwards read no ring or state at length 0, but a zeroed row is what an
    // inspection expects.
    for (size_t l = 0; l < kinds_.size(); ++l) {
      if (kinds_[l] == AttentionKind::Sliding) {
        k_[l].slice(0, row, row + 1).fill_(0.0);
        v_[l].slice(0, row, row + 1).fill_(0.0);
      } else if (kinds_[l] == AttentionKind::Linear) {
        state_[l].slice(0, row, row + 1).fill_(0.0);
      }
    }
  }
  lengths_[static_cast<size_t>(row)] = len;
}

namespace {
// Positions [begin, begin + count) of `row` in a [B, Hkv, capacity, *] buffer, one head at a time,
// as byte offsets and byte counts.
template <class F>
void for_each_head_span(const Tensor& t, int64_t row, int64_t begin, int64_t count, F&& f) {
  const int64_t heads = t.size(1), cap = t.size(2), entry = t.size(3) * static_cast<int64_t>(dtype_size(t.dtype()));
  for (int64_t h = 0; h < heads; ++h) f(((row * heads + h) * cap + begin) * entry, count * entry);
}
}  // namespace

void KVCache::copy_row(int64_t src, int64_t dst, int64_t len) {
  CORELM_CHECK(src >= 0 && src < batch() && dst >= 0 && dst < batch(), IndexError, "KVCache::copy_row: rows ", src,
               " -> ", dst, " out of range for a batch of ", batch());
  CORELM_CHECK(len >= 0 && len <= capacity_, ValueError, "KVCache::copy_row: length ", len, " outside [0, ", capacity_, "]");
  check_whole_row(*this, src, len, "copy_row");
  if (src != dst) copy_from(*this, src, dst, len);
  lengths_[static_cast<size_t>(dst)] = len;
}

void KVCache::copy_from(const KVCache& src, int64_t src_row, int64_t dst_row, int64_t len) {
  CORELM_CHECK(src.types_.k == types_.k && src.types_.v == types_.v && src.layers() == layers() &&
                   src.head_dim_ == head_dim_ && src.kv_heads_ == kv_heads_,
               ValueError, "KVCache::copy_from: the caches differ in types or shape");
  CORELM_CHECK(src_row >= 0 && src_row < src.batch() && dst_row >= 0 && dst_row < batch(), IndexError,
               "KVCache::copy_from: rows ", src_row, " -> ", dst_row, " out of range");
  CORELM_CHECK(len >= 0 && len <= capacity_ && len <= src.capacity_, ValueError, "KVCache::copy_from: length ", len,
               " exceeds a capacity");
  CORELM_CHECK(src.kinds_ == kinds_, ValueError, "KVCache::copy_from: the caches' layer kinds differ");
  check_whole_row(src, src_row, len, "copy_from");
  // The ring or state copied is the history of exactly len positions: the row now has that length.
  if (!all_full_) lengths_[static_cast<size_t>(dst_row)] = len;
  for (size_t l = 0; l < k_.size(); ++l) {
    if (kinds_[l] != AttentionKind::Full) {
      // A ring or a state is the row's whole history: copied whole.
      for (int side = 0; side < 3; ++side) {
        const Tensor& from = side == 0 ? src.k_[l] : side == 1 ? src.v_[l] : src.state_[l];
        Tensor& to = side == 0 ? k_[l] : side == 1 ? v_[l] : state_[l];
        if (!from.defined()) continue;
        const int64_t n = from.numel() / from.size(0) * 4;
        std::memmove(static_cast<uint8_t*>(to.raw_data()) + dst_row * n,
                     static_cast<const uint8_t*>(from.raw_data()) + src_row * n, static_cast<size_t>(n));
      }
      continue;
    }
    for (int side = 0; side < 2; ++side) {
      const Tensor& from = side == 0 ? src.k_[l] : src.v_[l];
      Tensor& to = side == 0 ? k_[l] : v_[l];
      const auto* in = static_cast<const uint8_t*>(from.raw_data());
      auto* out = static_cast<uint8_t*>(to.raw_data());
      std::vector<int64_t> offsets;
      for_each_head_span(from, src_row, 0, len, [&](int64_t off, int64_t) { offsets.push_back(off); });
      size_t i = 0;
      for_each_head_span(to, dst_row, 0, len, [&](int64_t off, int64_t n) {
        std::memmove(out + off, in + offsets[i++], static_cast<size_t>(n));
      });
    }
  }
}

void KVCache::check_whole_row(const KVCache& src, int64_t src_row, int64_t len, const char* fn) const {
  CORELM_CHECK(all_full_ || len == 0 || len == src.length(src_row), ValueError, "KVCache::", fn, ": ", len,
               " positions of a row holding ", src.length(src_row),
               "; with sliding-window rings or linear-attention states only a whole row can be copied");
}

int64_t KVCache::block_bytes(int64_t count) const {
  CORELM_CHECK(all_full_, ValueError, "KVCache::block_bytes: sliding-window rings and linear-attention states have no "
               "position blocks (check supports_prefix_blocks())");
  if (k_.empty()) return 0;
  return layers() * k_[0].size(1) * count * (k_row_bytes_ + v_row_bytes_);
}

void KVCache::read_block(int64_t row, int64_t begin, int64_t count, uint8_t* out) const {
  CORELM_CHECK(all_full_, ValueError, "KVCache::read_block: this cache has sliding-window rings or linear-attention "
               "states (check supports_prefix_blocks())");
  CORELM_CHECK(row >= 0 && row < batch(), IndexError, "KVCache::read_block: row ", row, " out of range for a batch of ", batch());
  CORELM_CHECK(begin >= 0 && count >= 0 && begin + count <= capacity_, ValueError, "KVCache::read_block: positions [",
               begin, ", ", begin + count, ") outside the capacity ", capacity_);
  for (size_t l = 0; l < k_.size(); ++l)
    for (const Tensor* t : {&k_[l], &v_[l]}) {
      const auto* base = static_cast<const uint8_t*>(t->raw_data());
      for_each_head_span(*t, row, begin, count, [&](int64_t off, int64_t n) { out = std::copy_n(base + off, n, out); });
    }
}

void KVCache::write_block(int64_t row, int64_t begin, int64_t count, const uint8_t* in) {
  CORELM_CHECK(all_full_, ValueError, "KVCache::write_block: this cache has sliding-window rings or linear-attention "
               "states (check supports_prefix_blocks())");
  CORELM_CHECK(row >= 0 && row < batch(), IndexError, "KVCache::write_block: row ", row, " out of range for a batch of ", batch());
  CORELM_CHECK(begin >= 0 && count >= 0 && begin + count <= capacity_, ValueError, "KVCache::write_block: positions [",
               begin, ", ", begin + count, ") outside the capacity ", capacity_);
  for (size_t l = 0; l < k_.size(); ++l)
    for (Tensor* t : {&k_[l], &v_[l]}) {
      auto* base = static_cast<uint8_t*>(t->raw_data());
      for_each_head_span(*t, row, begin, count, [&](int64_t off, int64_t n) {
        std::copy_n(in, n, base + off);
        in += n;
      });
    }
}

void KVCache::reset() {
  for (auto& len : lengths_) len = 0;
}

}  // namespace corelm::model
