// The hand-vectorised attention over encoded KV caches (kernels/cpu/kv_attention_tiles.h, run by
// quant_attention_head from Isa::Avx2 up) against its two yardsticks: the portable kernel
// (quant_attention_head at Isa::Reference, kv_attention_impl.h) and the dequantise-then-attend
// reference (the cache decoded to f32, reference::fused_attention_head). Over every format as K
// and as V, cache lengths around the 8- and 16-key blocks and the 32-value chunks, head_dim 64
// and 128, grouped-query heads. Also: a head's output does not depend on the other rows, kv heads
// or the positions past the query; a NaN block stays visible; unsupported head sizes fall back.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "corelm/isa.h"
#include "kernel_test_util.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/kv_attention.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/reference/fused.h"

namespace corelm::kernels {
namespace {

using corelm::testing::random_floats;

const std::vector<KVFormat> kAll = {KVFormat::F32,  KVFormat::BF16,   KVFormat::F16,   KVFormat::Q8_0,
                                    KVFormat::Q4_0, KVFormat::Turbo4, KVFormat::Turbo3};

// Every format as K and V with the same type, and each quantized K with an f16 / turbo4 V and
// the reverse (the asymmetric q8_0-K + turbo4-V cache among them).
std::vector<QuantCacheFormats> format_pairs() {
  std::vector<QuantCacheFormats> pairs;
  for (KVFormat f : kAll) pairs.push_back({f, f});
  for (KVFormat f : {KVFormat::Q8_0, KVFormat::Q4_0, KVFormat::Turbo3}) {
    pairs.push_back({f, KVFormat::Turbo4});
    pairs.push_back({KVFormat::F16, f});
  }
  pairs.push_back({KVFormat::F32, KVFormat::Q8_0});
  return pairs;
}

// One batch row of a cache of `cap` positions: random K/V encoded, and their decoded f32 copies.
struct Cache {
  int64_t D, Hkv, cap;
  QuantCacheFormats f;
  std::vector<uint8_t> kb, vb;
  std::vector<float> kd, vd;
  Cache(int64_t D_, int64_t Hkv_, int64_t cap_, QuantCacheFormats f_, uint64_t seed) : D(D_), Hkv(Hkv_), cap(cap_), f(f_) {
    const int64_t krb = kv_row_bytes(f.k, D), vrb = kv_row_bytes(f.v, D), n = Hkv * cap;
    const std::vector<float> k = random_floats(static_cast<size_t>(n * D), seed, 2.0f);
    const std::vector<float> v = random_floats(static_cast<size_t>(n * D), seed + 1);
    kb.resize(static_cast<size_t>(n * krb));
    vb.resize(static_cast<size_t>(n * vrb));
    kd.resize(k.size());
    vd.resize(v.size());
    for (int64_t e = 0; e < n; ++e) {
      kv_encode_row(f.k, k.data() + e * D, D, kb.data() + e * krb);
      kv_encode_row(f.v, v.data() + e * D, D, vb.data() + e * vrb);
      kv_decode_row(f.k, kb.data() + e * krb, D, kd.data() + e * D);
      kv_decode_row(f.v, vb.data() + e * vrb, D, vd.data() + e * D);
    }
  }
};

std::vector<float> attend(const Cache& c, const float* q, int64_t head, int64_t pos, const CachedAttention& shape) {
  std::vector<float> out(static_cast<size_t>(c.D));
  quant_attention_head(q, c.kb.data(), c.vb.data(), out.data(), head, pos, shape, c.f);
  return out;
}

// Fast path vs the portable kernel and vs the decoded reference: |Δ| <= 2e-5 · max(1, |want|),
// the existing kernel's tolerance (f32 summation order and exp's ~1 ulp; no quantized query).
TEST(KVAttentionFast, MatchesThePortableKernelAndTheDecodedReference) {
  const Isa best = active_isa();
  if (best < Isa::Avx2) GTEST_SKIP() << "no vector path on this CPU (or CORELM_ISA=reference)";
  const std::vector<int64_t> lengths = {1, 31, 32, 33, 1000};
  for (int64_t D : {64, 128}) {
    const int64_t Hq = 6, Hkv = 2, cap = 1000;  // 3 query heads per kv head
    const CachedAttention shape{Hq, Hkv, D, cap, 1.0f / std::sqrt(float(D))};
    const std::vector<float> q = random_floats(static_cast<size_t>(Hq * D), 31 + D, 2.0f);
    for (const QuantCacheFormats& f : format_pairs()) {
      const Cache c(D, Hkv, cap, f, 100 + D);
      double max_portable = 0, max_reference = 0;
      for (int64_t len : lengths) {
        // The group entry point (what the model calls: 3 heads per kv head here) beside the per-head one.
        std::vector<float> grouped(static_cast<size_t>(Hq * D));
        for (int64_t g = 0; g < Hkv; ++g)
          quant_attention_group(q.data() + g * 3 * D, c.kb.data(), c.vb.data(), grouped.data() + g * 3 * D, g, len - 1,
                                shape, f);
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t pos = len - 1;
          const std::vector<float> got = attend(c, q.data() + h * D, h, pos, shape);
          std::vector<float> portable, want(static_cast<size_t>(D));
          {
            ScopedIsa ref(Isa::Reference);
            portable = attend(c, q.data() + h * D, h, pos, shape);
          }
          reference::fused_attention_head(q.data() + h * D, c.kd.data(), c.vd.data(), want.data(), h, pos, shape);
          for (int64_t i = 0; i < D; ++i) {
            const double tol = 2e-5 * std::max(1.0f, std::fabs(want[i]));
            ASSERT_NEAR(got[i], want[i], tol) << kv_format_name(f.k) << "/" << kv_format_name(f.v) << " D=" << D
                                              << " keys=" << len << " head=" << h << " i=" << i;
            ASSERT_NEAR(got[i], portable[i], tol) << kv_format_name(f.k) << "/" << kv_format_name(f.v) << " D=" << D
                                                  << " keys=" << len << " head=" << h << " i=" << i;
            ASSERT_NEAR(grouped[h * D + i], want[i], tol) << kv_format_name(f.k) << "/" << kv_format_name(f.v)
                                                          << " grouped D=" << D << " keys=" << len << " head=" << h;
            max_reference = std::max({max_reference, std::fabs(double(got[i]) - want[i]),
                                      std::fabs(double(grouped[h * D + i]) - want[i])});
            max_portable = std::max(max_portable, std::fabs(double(got[i]) - portable[i]));
          }
        }
      }
      std::printf("[kv-attn] %s %-6s/%-6s D=%3lld max |fast (head, group) - decoded ref| %.3g, max |fast - portable| %.3g\n",
                  isa_name(best), kv_format_name(f.k), kv_format_name(f.v), static_cast<long long>(D), max_reference,
                  max_portable);
    }
  }
}

// quant_attention_group (all query heads of one kv head at once, each cache row decoded once for
// the group) gives every head what quant_attention_head gives it: the same bits for a group of 1,
// within f32 summation order otherwise (G > 1 drops the even/odd value chains), for groups that
// take one pass (2, 3, 4) and several (6 = 4 + 2, 8 = 4 + 4).
TEST(KVAttentionFast, GroupOfQueryHeadsMatchesHeadByHead) {
  const int64_t D = 64, Hkv = 2, pos = 70;
  for (int64_t G : {1, 2, 3, 4, 6, 8}) {
    const int64_t Hq = G * Hkv;
    const CachedAttention shape{Hq, Hkv, D, 80, 0.125f};
    const std::vector<float> q = random_floats(static_cast<size_t>(Hq * D), 40 + G, 2.0f);
    for (const QuantCacheFormats& f : format_pairs()) {
      const Cache c(D, Hkv, 80, f, 60 + G);
      std::vector<float> group(static_cast<size_t>(Hq * D));
      for (int64_t g = 0; g < Hkv; ++g)
        quant_attention_group(q.data() + g * G * D, c.kb.data(), c.vb.data(), group.data() + g * G * D, g, pos, shape,
                              f);
      for (int64_t h = 0; h < Hq; ++h) {
        const std::vector<float> alone = attend(c, q.data() + h * D, h, pos, shape);
        for (int64_t i = 0; i < D; ++i) {
          if (G == 1) {
            ASSERT_EQ(std::memcmp(&alone[i], &group[h * D + i], 4), 0) << kv_format_name(f.k) << " head " << h;
          } else {
            ASSERT_NEAR(group[h * D + i], alone[i], 2e-5 * std::max(1.0f, std::fabs(alone[i])))
                << kv_format_name(f.k) << "/" << kv_format_name(f.v) << " G=" << G << " head " << h << " i=" << i;
          }
        }
      }
    }
  }
}

// A head's output depends only on its own kv head's first pos + 1 positions: other batch rows,
// other kv heads and the positions past the query may hold anything (here: other random rows,
// and NaN bytes past the query) without changing a bit. The kernel keeps no state between calls,
// so the thread that runs it cannot matter either.
TEST(KVAttentionFast, OutputIgnoresOtherRowsHeadsAndLaterPositions) {
  const int64_t D = 64, Hq = 4, Hkv = 2, cap = 80, pos = 45;
  const CachedAttention shape{Hq, Hkv, D, cap, 0.125f};
  const std::vector<float> q = random_floats(static_cast<size_t>(Hq * D), 5, 2.0f);
  for (const QuantCacheFormats& f : format_pairs()) {
    const Cache a(D, Hkv, cap, f, 7), b(D, Hkv, cap, f, 8);
    const int64_t krb = kv_row_bytes(f.k, D), vrb = kv_row_bytes(f.v, D);
    // Row 1 of a 3-row cache: kv head 0 from a, kv head 1 from b; rows 0 and 2 from b; positions
    // past the query set to 0xFF bytes (NaN scales / values).
    const int64_t krow = Hkv * cap * krb, vrow = Hkv * cap * vrb;
    std::vector<uint8_t> kb(static_cast<size_t>(3 * krow)), vb(static_cast<size_t>(3 * vrow));
    for (int64_t r = 0; r < 3; ++r) {
      std::memcpy(kb.data() + r * krow, b.kb.data(), static_cast<size_t>(krow));
      std::memcpy(vb.data() + r * vrow, b.vb.data(), static_cast<size_t>(vrow));
    }
    std::memcpy(kb.data() + krow, a.kb.data(), static_cast<size_t>(cap * krb));
    std::memcpy(vb.data() + vrow, a.vb.data(), static_cast<size_t>(cap * vrb));
    std::memset(kb.data() + krow + (pos + 1) * krb, 0xFF, static_cast<size_t>((cap - pos - 1) * krb));
    std::memset(vb.data() + vrow + (pos + 1) * vrb, 0xFF, static_cast<size_t>((cap - pos - 1) * vrb));
    for (int64_t h : {0, 1}) {  // both read kv head 0
      const std::vector<float> alone = attend(a, q.data() + h * D, h, pos, shape);
      std::vector<float> inside(static_cast<size_t>(D));
      quant_attention_head(q.data() + h * D, kb.data() + krow, vb.data() + vrow, inside.data(), h, pos, shape, f);
      EXPECT_EQ(0, std::memcmp(alone.data(), inside.data(), static_cast<size_t>(D) * 4))
          << kv_format_name(f.k) << "/" << kv_format_name(f.v) << " head " << h;
    }
  }
}

// A block whose scale is NaN (how the formats mark a non-finite input) makes the output NaN, as
// the decoded reference does, instead of vanishing in exp's range clamp.
TEST(KVAttentionFast, NaNBlockStaysVisible) {
  const int64_t D = 64, Hq = 1, Hkv = 1, cap = 20;
  const CachedAttention shape{Hq, Hkv, D, cap, 0.125f};
  const std::vector<float> q = random_floats(static_cast<size_t>(D), 3);
  for (KVFormat f : kAll) {
    Cache k_bad(D, Hkv, cap, {f, KVFormat::F32}, 9), v_bad(D, Hkv, cap, {KVFormat::F32, f}, 9);
    std::vector<float> x = random_floats(static_cast<size_t>(D), 4);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    kv_encode_row(f, x.data(), D, k_bad.kb.data() + 7 * kv_row_bytes(f, D));
    kv_encode_row(f, x.data(), D, v_bad.vb.data() + 7 * kv_row_bytes(f, D));
    EXPECT_TRUE(std::isnan(attend(k_bad, q.data(), 0, 12, shape)[0])) << "K " << kv_format_name(f);
    const std::vector<float> out = attend(v_bad, q.data(), 0, 12, shape);
    EXPECT_TRUE(std::isnan(out[3])) << "V " << kv_format_name(f);
    EXPECT_FALSE(std::isnan(attend(k_bad, q.data(), 0, 6, shape)[0])) << "NaN past the query leaked, K "
                                                                      << kv_format_name(f);
  }
}

// Head sizes the vector kernel does not take (not a multiple of 32, or above 256) go to the
// portable kernel and give its result.
TEST(KVAttentionFast, OtherHeadSizesFallBackToThePortableKernel) {
  for (int64_t D : {48, 40, 512}) {
    const int64_t Hq = 2, Hkv = 1, cap = 24;
    const CachedAttention shape{Hq, Hkv, D, cap, 1.0f / std::sqrt(float(D))};
    const std::vector<float> q = random_floats(static_cast<size_t>(Hq * D), 13);
    for (KVFormat f : {KVFormat::F16, KVFormat::BF16}) {
      const Cache c(D, Hkv, cap, {f, f}, 17);
      const std::vector<float> got = attend(c, q.data() + D, 1, 20, shape);
      std::vector<float> want(static_cast<size_t>(D));
      reference::fused_attention_head(q.data() + D, c.kd.data(), c.vd.data(), want.data(), 1, 20, shape);
      for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(got[i], want[i], 2e-5 * std::max(1.0f, std::fabs(want[i]))) << D;
    }
  }
}

}  // namespace
}  // namespace corelm::kernels

namespace corelm::kernels {
namespace {

// The kernels alone, one smollm2-135m layer (9 query heads over 3 kv heads, head_dim 64) at
// 4096 cached positions, best of 15 repetitions, against the f32 kernel on the same shape:
// test_kernels --gtest_also_run_disabled_tests --gtest_filter='*BenchOneLayer*'.
TEST(KVAttentionFast, DISABLED_BenchOneLayer) {
  const int64_t D = 64, Hq = 9, Hkv = 3, keys = 4096;
  const CachedAttention shape{Hq, Hkv, D, keys, 0.125f};
  const std::vector<float> q = random_floats(static_cast<size_t>(Hq * D), 1);
  std::vector<float> out(static_cast<size_t>(Hq * D));
  auto best_of = [](auto&& fn) {
    double best = 1e30;
    for (int rep = 0; rep < 15; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  {
    const Cache c(D, Hkv, keys, {KVFormat::F32, KVFormat::F32}, 2);
    const double t = best_of([&] {
      for (int64_t h = 0; h < Hq; ++h)
        fused_attention_head(q.data() + h * D, c.kd.data(), c.vd.data(), out.data() + h * D, h, keys - 1, shape);
    });
    std::printf("[kv-layer] f32 kernel          %7.1f us  (%.2f ns per key and query head)\n", t * 1e6,
                t * 1e9 / double(keys * Hq));
  }
  for (KVFormat f : kAll) {
    const Cache c(D, Hkv, keys, {f, f}, 2);
    const double t = best_of([&] {
      for (int64_t g = 0; g < Hkv; ++g)
        quant_attention_group(q.data() + g * 3 * D, c.kb.data(), c.vb.data(), out.data() + g * 3 * D, g, keys - 1,
                              shape, c.f);
    });
    std::printf("[kv-layer] %-6s group kernel    %7.1f us  (%.2f ns per key and query head)\n", kv_format_name(f),
                t * 1e6, t * 1e9 / double(keys * Hq));
  }
}

}  // namespace
}  // namespace corelm::kernels
