// KVCache: one [B, Hkv, capacity, D] f32 buffer per layer for keys and for values, allocated
// once up front (no allocation per decoded token), plus each row's filled length. Callers size
// the capacity by what a request can reach (generate: prompt + max new tokens, bounded by the
// context), never by the model's context alone: a 2^31-token context is a config value, not
// memory anybody has.
#include <algorithm>
#include <cstdio>

#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/out_of_memory.h"

namespace corelm::model {

namespace {
std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1 << 20));
  return buf;
}
}  // namespace

KVCache::KVCache(const ModelConfig& config, int64_t batch, int64_t capacity) : capacity_(capacity) {
  config.validate();
  CORELM_CHECK(batch > 0, ValueError, "KVCache: batch must be positive, got ", batch);
  CORELM_CHECK(capacity > 0, ValueError, "KVCache: capacity must be positive, got ", capacity);
  const int64_t d = config.head_dim == 0 ? config.hidden_size / config.num_attention_heads : config.head_dim;
  // In double: the product of a hostile config's sizes may not fit an int64.
  const double total = 2.0 * double(config.num_hidden_layers) * double(batch) * double(config.num_key_value_heads) *
                       double(capacity) * double(d) * sizeof(float);
  const auto what = [&] {
    return detail::concat("a KV cache of ", batch, " rows x ", capacity, " positions x ", config.num_hidden_layers,
                          " layers (", config.num_key_value_heads, " kv heads x ", d, " dims, fp32 keys and values)");
  };
  // Past this no allocation can succeed, and the byte counts would not fit a size_t.
  CORELM_CHECK(total <= double(size_t{1} << 62), ValueError, what(), " needs ", mib(total),
               ": more than memory can address");
  lengths_.assign(static_cast<size_t>(batch), 0);
  try {
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      k_.push_back(Tensor::zeros({batch, config.num_key_value_heads, capacity, d}));
      v_.push_back(Tensor::zeros({batch, config.num_key_value_heads, capacity, d}));
    }
  } catch (const OutOfMemoryError&) {
    throw OutOfMemoryError(static_cast<size_t>(total), what());  // the whole cache, not the one layer that failed
  }
}

void KVCache::set_length(int64_t row, int64_t len) {
  CORELM_CHECK(row >= 0 && row < batch(), IndexError, "KVCache: row ", row, " out of range for a batch of ", batch());
  CORELM_CHECK(len >= 0 && len <= capacity_, ValueError, "KVCache: length ", len, " outside [0, ", capacity_, "]");
  lengths_[static_cast<size_t>(row)] = len;
}

namespace {
// Positions [begin, begin + count) of `row` in a [B, Hkv, capacity, D] buffer, one head at a time.
template <class F>
void for_each_head_span(const Tensor& t, int64_t row, int64_t begin, int64_t count, F&& f) {
  const int64_t heads = t.size(1), cap = t.size(2), d = t.size(3);
  for (int64_t h = 0; h < heads; ++h) f(((row * heads + h) * cap + begin) * d, count * d);
}
}  // namespace

void KVCache::copy_row(int64_t src, int64_t dst, int64_t len) {
  CORELM_CHECK(src >= 0 && src < batch() && dst >= 0 && dst < batch(), IndexError, "KVCache::copy_row: rows ", src,
               " -> ", dst, " out of range for a batch of ", batch());
  CORELM_CHECK(len >= 0 && len <= capacity_, ValueError, "KVCache::copy_row: length ", len, " outside [0, ", capacity_, "]");
  if (src != dst)
    for (std::vector<Tensor>* kv : {&k_, &v_})
      for (Tensor& t : *kv) {
        float* base = t.data<float>();
        const int64_t heads = t.size(1), cap = t.size(2), d = t.size(3);
        for (int64_t h = 0; h < heads; ++h)
          std::copy_n(base + (src * heads + h) * cap * d, len * d, base + (dst * heads + h) * cap * d);
      }
  lengths_[static_cast<size_t>(dst)] = len;
}

int64_t KVCache::block_floats(int64_t count) const {
  if (k_.empty()) return 0;
  return 2 * static_cast<int64_t>(k_.size()) * k_[0].size(1) * count * k_[0].size(3);
}

void KVCache::read_block(int64_t row, int64_t begin, int64_t count, float* out) const {
  CORELM_CHECK(row >= 0 && row < batch(), IndexError, "KVCache::read_block: row ", row, " out of range for a batch of ", batch());
  CORELM_CHECK(begin >= 0 && count >= 0 && begin + count <= capacity_, ValueError, "KVCache::read_block: positions [",
               begin, ", ", begin + count, ") outside the capacity ", capacity_);
  for (size_t l = 0; l < k_.size(); ++l)
    for (const Tensor* t : {&k_[l], &v_[l]}) {
      const float* base = t->data<float>();
      for_each_head_span(*t, row, begin, count, [&](int64_t off, int64_t n) { out = std::copy_n(base + off, n, out); });
    }
}

void KVCache::write_block(int64_t row, int64_t begin, int64_t count, const float* in) {
  CORELM_CHECK(row >= 0 && row < batch(), IndexError, "KVCache::write_block: row ", row, " out of range for a batch of ", batch());
  CORELM_CHECK(begin >= 0 && count >= 0 && begin + count <= capacity_, ValueError, "KVCache::write_block: positions [",
               begin, ", ", begin + count, ") outside the capacity ", capacity_);
  for (size_t l = 0; l < k_.size(); ++l)
    for (Tensor* t : {&k_[l], &v_[l]}) {
      float* base = t->data<float>();
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
