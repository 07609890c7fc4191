// --cache-type-k / --cache-type-v, shared by generate, eval, run and serve: the strings are
// parsed here with model::parse_kv_cache_type and only the enum goes down to the library.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "corelm/error.h"
#include "corelm/kv_cache_type.h"

namespace corelm::cli {

inline constexpr const char* kKVCacheTypeNames = "f32, bf16, f16, q8_0, q4_0, turbo4 or turbo3";

inline void add_kv_cache_flags(CLI::App* c, std::string& k, std::string& v) {
  c->add_option("--cache-type-k", k, std::string("what the KV cache stores for keys: ") + kKVCacheTypeNames +
                                         " (docs/KERNELS.md: KV cache formats)")
      ->capture_default_str();
  c->add_option("--cache-type-v", v, std::string("what the KV cache stores for values: ") + kKVCacheTypeNames)
      ->capture_default_str();
}

// ValueError naming the flag and the accepted names for anything else.
inline model::KVCacheTypes parse_kv_cache_flags(const std::string& k, const std::string& v) {
  model::KVCacheTypes t;
  try {
    t.k = model::parse_kv_cache_type(k);
  } catch (const ValueError& e) {
    throw ValueError(std::string("--cache-type-k: ") + e.what());
  }
  try {
    t.v = model::parse_kv_cache_type(v);
  } catch (const ValueError& e) {
    throw ValueError(std::string("--cache-type-v: ") + e.what());
  }
  return t;
}

}  // namespace corelm::cli
