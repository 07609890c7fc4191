#include "corelm/kv_cache_type.h"

#include "corelm/error.h"

namespace corelm::model {

const char* kv_cache_type_name(KVCacheType t) {
  switch (t) {
    case KVCacheType::F32: return "f32";
    case KVCacheType::BF16: return "bf16";
    case KVCacheType::F16: return "f16";
    case KVCacheType::Q8_0: return "q8_0";
    case KVCacheType::Q4_0: return "q4_0";
    case KVCacheType::Turbo4: return "turbo4";
    case KVCacheType::Turbo3: return "turbo3";
  }
  return "f32";
}

KVCacheType parse_kv_cache_type(const std::string& s) {
  for (KVCacheType t : {KVCacheType::F32, KVCacheType::BF16, KVCacheType::F16, KVCacheType::Q8_0, KVCacheType::Q4_0,
                        KVCacheType::Turbo4, KVCacheType::Turbo3})
    if (s == kv_cache_type_name(t)) return t;
  throw ValueError("unknown KV cache type '" + s + "' (use f32, bf16, f16, q8_0, q4_0, turbo4 or turbo3)");
}

}  // namespace corelm::model
