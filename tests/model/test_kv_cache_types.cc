// Typed KV caches (KVCacheType): storage sizes, the Decoder's make_cache seam, decoding with
// each type against a full re-forward (f32: exact as before; others: within a stated
// tolerance), the fast path against the reference path, batch/thread invariance with quantized
// caches, and the byte-level row/block sharing the scheduler's prefix cache relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/thread_pool.h"

namespace corelm::model {
namespace {

const std::vector<KVCacheType> kTypes = {KVCacheType::F32,  KVCacheType::BF16,   KVCacheType::F16,   KVCacheType::Q8_0,
                                         KVCacheType::Q4_0, KVCacheType::Turbo4, KVCacheType::Turbo3};

ModelConfig config() {
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 128;
  c.initializer_range = 0.08;
  return c;
}

std::vector<int64_t> tokens(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int64_t>(seed >> 33) % vocab;
  }
  return ids;
}

// Bytes one position of one head vector takes, from the formats' definitions (kv_quant.h).
int64_t entry_bytes(KVCacheType t, int64_t d) {
  switch (t) {
    case KVCacheType::F32: return 4 * d;
    case KVCacheType::BF16:
    case KVCacheType::F16: return 2 * d;
    case KVCacheType::Q8_0: return d / 32 * 34;
    case KVCacheType::Q4_0: return d / 32 * 18;
    case KVCacheType::Turbo4: return d >= 128 ? d / 128 * 66 : 2 + d / 2;
    case KVCacheType::Turbo3: return d >= 128 ? d / 128 * 50 : 2 + 3 * d / 8;
  }
  return 0;
}

TEST(KVCacheTypes, BytesPerTokenFollowTheFormats) {
  for (const char* preset : {"tiny", "smollm2-135m"}) {
    const ModelConfig c = ModelConfig::preset(preset);
    for (KVCacheType k : kTypes)
      for (KVCacheType v : {KVCacheType::F32, KVCacheType::Q4_0, k}) {
        const KVCache cache(c, 1, 4, {k, v});
        EXPECT_EQ(cache.bytes_per_token(), c.num_hidden_layers * c.num_key_value_heads *
                                               (entry_bytes(k, c.head_dim) + entry_bytes(v, c.head_dim)))
            << preset << " " << kv_cache_type_name(k) << "/" << kv_cache_type_name(v);
        EXPECT_EQ(cache.block_bytes(3), 3 * cache.bytes_per_token());
      }
  }
}

TEST(KVCacheTypes, DecoderMakesCachesOfItsTypesAndRejectsMisfits) {
  Decoder d(config());
  EXPECT_TRUE(d.kv_cache_types().all_f32());
  d.set_kv_cache_types({KVCacheType::Q8_0, KVCacheType::Turbo3});
  KVCache cache = d.make_cache(2, 8);
  EXPECT_EQ(cache.types().k, KVCacheType::Q8_0);
  EXPECT_EQ(cache.types().v, KVCacheType::Turbo3);
  EXPECT_THROW(cache.k(0), ValueError);  // raw f32 views exist only for f32 sides
  EXPECT_THROW(cache.v(0), ValueError);
  EXPECT_EQ(cache.k_bytes(0).dtype(), DType::U8);

  ModelConfig odd = config();
  odd.hidden_size = 96;
  odd.head_dim = 24;  // fits neither the 32-blocks nor the turbo blocks
  Decoder e(odd);
  for (KVCacheType t : {KVCacheType::Q8_0, KVCacheType::Q4_0, KVCacheType::Turbo4, KVCacheType::Turbo3}) {
    try {
      e.set_kv_cache_types({t, KVCacheType::F32});
      FAIL() << kv_cache_type_name(t) << " accepted head_dim 24";
    } catch (const ValueError& err) {
      EXPECT_NE(std::string(err.what()).find("head_dim"), std::string::npos) << err.what();
    }
  }
  EXPECT_TRUE(e.kv_cache_types().all_f32());  // unchanged by the failed calls
  e.set_kv_cache_types({KVCacheType::BF16, KVCacheType::F16});
}

// max |a - b| / max |b| over two logit tensors.
double rel_diff(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    diff = std::max(diff, std::fabs(double(x.data<float>()[i]) - double(y.data<float>()[i])));
    ref = std::max(ref, std::fabs(double(y.data<float>()[i])));
  }
  return diff / ref;
}

// Prefill 9 tokens then decode 7 one at a time, against one full forward over all 16 tokens.
// Tolerances (max logit error relative to the largest logit) are about twice the errors measured
// for this random model (reference path / fast path, 2026-12-03): bf16 0.003 / 0.006, f16
// 0.0004 / 0.004, q8_0 0.011 / 0.011, q4_0 0.16 / 0.15, turbo4 0.17 / 0.19, turbo3 0.36 / 0.34.
// The fast path's floor is its bf16 activations: any change upstream flips some roundings.
// A random model's logits are small and its attention diffuse, so these are not quality figures
// (docs/BENCHMARKS.md has greedy agreement on a trained model).
double tolerance(KVCacheType t) {
  switch (t) {
    case KVCacheType::F32: return 1e-5;
    case KVCacheType::BF16: return 1.5e-2;
    case KVCacheType::F16: return 1e-2;
    case KVCacheType::Q8_0: return 2.5e-2;
    case KVCacheType::Q4_0: return 0.32;
    case KVCacheType::Turbo4: return 0.38;
    case KVCacheType::Turbo3: return 0.7;
  }
  return 0;
}

Tensor decode_logits(const Decoder& d, KVCache& cache, const std::vector<int64_t>& ids, int64_t prefill) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> first(ids.begin(), ids.begin() + prefill);
  std::vector<Tensor> parts{d.forward_cached(Tensor::from_vector(first, {1, prefill}), cache, {0})};
  for (int64_t t = prefill; t < n; ++t)
    parts.push_back(d.forward_cached(Tensor::from_vector(std::vector<int64_t>{ids[t]}, {1, 1}), cache, {0}));
  std::vector<float> all;  // [1, n, V]: the parts in time order
  for (const Tensor& p : parts) {
    const Tensor c = p.contiguous();
    all.insert(all.end(), c.data<float>(), c.data<float>() + c.numel());
  }
  return Tensor::from_vector(all, {1, n, d.config().vocab_size});
}

TEST(KVCacheTypes, DecodeMatchesAFullForwardWithinEachTypesTolerance) {
  Decoder d(config());
  d.init_weights(7);
  const std::vector<int64_t> ids = tokens(16, 3, config().vocab_size);
  const Tensor full = d.forward(Tensor::from_vector(ids, {1, 16}));
  for (bool fast : {false, true}) {
    // The reference path is measured against the full reference forward; the fast path against
    // its own decode with an f32 cache (its bf16 linears differ from the reference by ~1e-2 on
    // their own, which would hide the cache's share).
    Tensor yardstick = full;
    if (fast) {
      d.prepare_inference(Precision::BF16);
      KVCache f32(d.config(), 1, 16);
      yardstick = decode_logits(d, f32, ids, 9);
    }
    for (KVCacheType t : kTypes) {
      KVCache cache(d.config(), 1, 16, {t, t});
      const Tensor got = decode_logits(d, cache, ids, 9);
      const double err = rel_diff(got, yardstick);
      EXPECT_LT(err, tolerance(t)) << (fast ? "fast " : "reference ") << kv_cache_type_name(t);
      if (t != KVCacheType::F32) {
        EXPECT_GT(err, 0.0) << "a lossy cache changed nothing: " << kv_cache_type_name(t);
      }
      std::printf("[kv] %s %-6s max rel logit error %.3g\n", fast ? "fast     " : "reference", kv_cache_type_name(t), err);
    }
  }
}

// The fast path (codes read in place) against the reference path (cache decoded, op attention)
// with the same cache type, both with f32 weights' numerics apart from the fast path's bf16
// linears: their difference is the bf16 linears', not the cache's.
TEST(KVCacheTypes, FastPathAgreesWithTheReferenceForEachType) {
  Decoder d(config());
  d.init_weights(9);
  const std::vector<int64_t> ids = tokens(12, 5, config().vocab_size);
  for (KVCacheType t : kTypes) {
    d.drop_inference();
    KVCache ref_cache(d.config(), 1, 12, {t, t});
    const Tensor ref = decode_logits(d, ref_cache, ids, 6);
    d.prepare_inference(Precision::BF16);
    KVCache fast_cache(d.config(), 1, 12, {t, t});
    const Tensor fast = decode_logits(d, fast_cache, ids, 6);
    EXPECT_LT(rel_diff(fast, ref), t == KVCacheType::F32 ? 2e-2 : 2.0 * tolerance(t)) << kv_cache_type_name(t);
  }
}

// A row alone vs the same row in a batch of 5 at another slot, other rows with other histories,
// 1 and 2 threads: bitwise the same logits, for the quantized caches too.
std::vector<float> row_trace(const Decoder& d, KVCacheTypes types, int64_t batch, int64_t slot, int threads) {
  set_num_threads(threads);
  const int64_t V = d.config().vocab_size;
  KVCache cache(d.config(), batch, 40, types);
  for (int64_t r = 0; r < batch; ++r)
    if (r != slot) {
      const std::vector<int64_t> h = tokens(3 + r, 100 + r, V);
      d.forward_cached(Tensor::from_vector(h, {1, static_cast<int64_t>(h.size())}), cache, {r}, Logits::None);
    }
  std::vector<float> out;
  std::vector<int64_t> rows, ids;
  for (int64_t r = 0; r < batch; ++r) {
    rows.push_back(r);
    const std::vector<int64_t> p = tokens(8, r == slot ? 42 : 200 + r, V);
    ids.insert(ids.end(), p.begin(), p.end());
  }
  Tensor logits = d.forward_cached(Tensor::from_vector(ids, {batch, 8}), cache, rows).contiguous();
  out.insert(out.end(), logits.data<float>() + slot * 8 * V, logits.data<float>() + (slot + 1) * 8 * V);
  for (int step = 0; step < 4; ++step) {
    std::vector<int64_t> next(static_cast<size_t>(batch));
    for (int64_t r = 0; r < batch; ++r) next[r] = (step * 31 + (r == slot ? 7 : r)) % V;
    logits = d.forward_cached(Tensor::from_vector(next, {batch, 1}), cache, rows).contiguous();
    out.insert(out.end(), logits.data<float>() + slot * V, logits.data<float>() + (slot + 1) * V);
  }
  set_num_threads(1);
  return out;
}

TEST(KVCacheTypes, QuantizedCachesKeepBatchAndThreadInvariance) {
  Decoder d(config());
  d.init_weights(11);
  d.prepare_inference(Precision::BF16);
  for (KVCacheTypes types : {KVCacheTypes{KVCacheType::Q8_0, KVCacheType::Q8_0},
                             KVCacheTypes{KVCacheType::Q4_0, KVCacheType::BF16},
                             KVCacheTypes{KVCacheType::Turbo3, KVCacheType::Turbo4},
                             KVCacheTypes{KVCacheType::F16, KVCacheType::Turbo3}}) {
    const std::vector<float> alone = row_trace(d, types, 1, 0, 1);
    for (auto [slot, threads] : {std::pair{3, 1}, std::pair{1, 2}}) {
      const std::vector<float> batched = row_trace(d, types, 5, slot, threads);
      ASSERT_EQ(alone.size(), batched.size());
      EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)))
          << kv_cache_type_name(types.k) << "/" << kv_cache_type_name(types.v) << " slot " << slot << " threads "
          << threads;
    }
  }
}

// The scheduler's prefix cache moves blocks as bytes: a block read from one row and written to
// another (and copy_row / copy_from) reproduces the same decoded values and the same next logits.
TEST(KVCacheTypes, BlocksAndRowCopiesMoveTheStoredBytes) {
  Decoder d(config());
  d.init_weights(13);
  d.prepare_inference(Precision::BF16);
  const std::vector<int64_t> ids = tokens(10, 17, config().vocab_size);
  for (KVCacheType t : kTypes) {
    KVCache cache(d.config(), 4, 16, {t, t});
    d.forward_cached(Tensor::from_vector(ids, {1, 10}), cache, {0}, Logits::None);
    std::vector<uint8_t> block(static_cast<size_t>(cache.block_bytes(8)));
    cache.read_block(0, 0, 8, block.data());
    cache.write_block(1, 0, 8, block.data());
    cache.set_length(1, 8);
    cache.copy_row(0, 2, 8);
    KVCache other(d.config(), 1, 16, {t, t});
    other.copy_from(cache, 0, 0, 8);
    other.set_length(0, 8);
    std::vector<float> a(8 * 64), b(8 * 64);
    for (int64_t r : {1, 2}) {
      cache.load_values(1, 0, 1, 0, 8, a.data());
      cache.load_values(1, r, 1, 0, 8, b.data());
      EXPECT_EQ(a, b) << kv_cache_type_name(t);
    }
    // Re-running positions 8, 9 on each copy gives the logits the original row gave.
    KVCache again(d.config(), 1, 16, {t, t});
    const std::vector<int64_t> tail(ids.begin() + 8, ids.end());
    std::vector<int64_t> head(ids.begin(), ids.begin() + 8);
    d.forward_cached(Tensor::from_vector(head, {1, 8}), again, {0}, Logits::None);
    const Tensor want = d.forward_cached(Tensor::from_vector(tail, {1, 2}), again, {0}).contiguous();
    for (int64_t r : {1, 2}) {
      const Tensor got = d.forward_cached(Tensor::from_vector(tail, {1, 2}), cache, {r}).contiguous();
      EXPECT_EQ(0, std::memcmp(got.data<float>(), want.data<float>(), want.nbytes())) << kv_cache_type_name(t);
    }
    const Tensor got = d.forward_cached(Tensor::from_vector(tail, {1, 2}), other, {0}).contiguous();
    EXPECT_EQ(0, std::memcmp(got.data<float>(), want.data<float>(), want.nbytes())) << kv_cache_type_name(t);
    if (t != KVCacheType::F32) {
      EXPECT_THROW(other.copy_from(KVCache(d.config(), 1, 16), 0, 0, 4), ValueError);  // types differ
    }
  }
}

}  // namespace
}  // namespace corelm::model

namespace corelm::model {
namespace {

// Decode speed per cache type at depth 0 and 4096 (or the depths given) on the smollm2-135m shape (random weights,
// bf16 fast path, 1 thread): the cache's first `depth` positions are filled with encoded random
// keys/values (speed does not depend on their values), then `steps` single-token steps are timed.
// Run by hand: test_model --gtest_also_run_disabled_tests --gtest_filter='*BenchKVCacheTypes*'
// (CORELM_KV_BENCH_STEPS overrides the 16 steps; CORELM_KV_BENCH_DEPTHS the depths, a comma list,
// default "0,4096", e.g. "0,4096,16384"). Results: docs/BENCHMARKS.md.
TEST(KVCacheTypes, DISABLED_BenchKVCacheTypes) {
  const char* steps_env = std::getenv("CORELM_KV_BENCH_STEPS");
  const int64_t steps = steps_env ? std::atoll(steps_env) : 16;
  const ModelConfig c = ModelConfig::preset("smollm2-135m");
  Decoder d(c);
  d.init_weights(1);
  d.prepare_inference(Precision::BF16);
  set_num_threads(1);
  std::vector<int64_t> depths;
  const char* depths_env = std::getenv("CORELM_KV_BENCH_DEPTHS");
  for (const char* p = depths_env ? depths_env : "0,4096"; *p;) {
    char* end = nullptr;
    depths.push_back(std::strtoll(p, &end, 10));
    ASSERT_TRUE(end != p && depths.back() >= 0) << "CORELM_KV_BENCH_DEPTHS: expected a comma list of depths, got "
                                                << depths_env;
    p = *end == ',' ? end + 1 : end;
  }
  const int64_t max_depth = *std::max_element(depths.begin(), depths.end());
  std::vector<float> noise(static_cast<size_t>(std::max<int64_t>(max_depth, 1) * c.head_dim));
  uint64_t s = 99;
  for (float& x : noise) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) % 2001 - 1000) / 500.0f;
  }
  for (KVCacheType t : kTypes)
    for (int64_t depth : depths) {
      KVCache cache(c, 1, depth + steps + 1, {t, t});
      if (depth > 0) {
        for (int64_t l = 0; l < c.num_hidden_layers; ++l)
          for (int64_t g = 0; g < c.num_key_value_heads; ++g) {
            cache.store_keys(l, 0, g, 0, depth, noise.data());
            cache.store_values(l, 0, g, 0, depth, noise.data());
          }
        cache.set_length(0, depth);
      }
      std::vector<int64_t> id{1};
      d.forward_cached_argmax(Tensor::from_vector(id, {1, 1}), cache, {0});  // warm-up step
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < steps; ++i) id[0] = d.forward_cached_argmax(Tensor::from_vector(id, {1, 1}), cache, {0})[0];
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("[kv-bench] %-6s depth %5lld: %7.2f tok/s (%lld steps, %lld KV bytes/token)\n", kv_cache_type_name(t),
                  static_cast<long long>(depth), double(steps) / sec, static_cast<long long>(steps),
                  static_cast<long long>(cache.bytes_per_token()));
    }
}

}  // namespace
}  // namespace corelm::model
