// What a KV cache stores per position: the type of the keys and the type of the values, chosen
// separately (llama.cpp's --cache-type-k / --cache-type-v). The names are the CLI and HTTP
// spellings; everything below the edges passes the enum.
#pragma once
#include <string>

namespace corelm::model {

enum class KVCacheType { F32, BF16, F16, Q8_0, Q4_0, Turbo4, Turbo3 };

const char* kv_cache_type_name(KVCacheType t);           // "f32" | "bf16" | ... | "turbo3"
KVCacheType parse_kv_cache_type(const std::string& s);   // ValueError listing the accepted names

struct KVCacheTypes {
  KVCacheType k = KVCacheType::F32;
  KVCacheType v = KVCacheType::F32;
  bool all_f32() const { return k == KVCacheType::F32 && v == KVCacheType::F32; }
};

}  // namespace corelm::model
