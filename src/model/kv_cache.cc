// KVCache: one [B, Hkv, capacity, D] f32 buffer per layer for keys and for values, allocated
// once up front (no allocation per decoded token), plus each row's filled length.
#include "corelm/error.h"
#include "corelm/model.h"

namespace corelm::model {

KVCache::KVCache(const ModelConfig& config, int64_t batch, int64_t capacity) : capacity_(capacity) {
  config.validate();
  CORELM_CHECK(batch > 0, ValueError, "KVCache: batch must be positive, got ", batch);
  CORELM_CHECK(capacity > 0, ValueError, "KVCache: capacity must be positive, got ", capacity);
  const int64_t d = config.head_dim == 0 ? config.hidden_size / config.num_attention_heads : config.head_dim;
  lengths_.assign(static_cast<size_t>(batch), 0);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    k_.push_back(Tensor::zeros({batch, config.num_key_value_heads, capacity, d}));
    v_.push_back(Tensor::zeros({batch, config.num_key_value_heads, capacity, d}));
  }
}

void KVCache::set_length(int64_t row, int64_t len) {
  CORELM_CHECK(row >= 0 && row < batch(), IndexError, "KVCache: row ", row, " out of range for a batch of ", batch());
  CORELM_CHECK(len >= 0 && len <= capacity_, ValueError, "KVCache: length ", len, " outside [0, ", capacity_, "]");
  lengths_[static_cast<size_t>(row)] = len;
}

void KVCache::reset() {
  for (auto& len : lengths_) len = 0;
}

}  // namespace corelm::model
