// The CPU inference backend (ops/inference_backend.h) is the kernels it wraps, bitwise: each
// backend call against the kernel of kernels/cpu/ it replaced, on the same seeded inputs, plus the
// token layout's positions, the scratch slots and the greedy head over a multi-block vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/fused.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_attention.h"
#include "kernels/cpu/linear_int8.h"
#include "ops/inference_backend.h"

namespace corelm::ops {
namespace {

std::vector<float> seeded(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(InferenceBackend, TokenLayoutPositionsWithAndWithoutOffset) {
  const std::vector<int64_t> start{5, 0, 17}, rows{2, 0, 1};
  TokenLayout all{3, 4, 0, start.data(), rows.data()};
  EXPECT_EQ(all.tokens(), 12);
  EXPECT_EQ(all.position(0), 5);
  EXPECT_EQ(all.position(7), 3);   // row 1, token 3
  EXPECT_EQ(all.position(11), 20); // row 2, token 3
  EXPECT_EQ(all.row_of(9), 2);
  TokenLayout last{3, 1, 3, start.data(), rows.data()};  // each row's last token only
  EXPECT_EQ(last.tokens(), 3);
  for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(last.position(b), all.position(b * 4 + 3));
}

TEST(InferenceBackend, LinearAndNormAreTheKernelsBitwise) {
  const InferenceBackend& be = cpu_backend();
  const int64_t m = 7, n = 40, k = 96;
  const std::vector<float> W = seeded(n * k, 1), bias = seeded(n, 2), X = seeded(m * k, 3), g = seeded(k, 4);
  std::vector<float> got(m * n), want(m * n);
  be.linear(*be.pack_linear(W.data(), n, k, bias.data(), WeightFormat::BF16), X.data(), m, k, got.data(), n);
  kernels::linear_bf16(X.data(), m, k,
                       kernels::pack_linear_bf16(W.data(), n, k, k, bias.data(), kernels::preferred_linear_bf16_kernel()),
                       want.data(), n);
  EXPECT_TRUE(same_bits(got, want)) << "bf16";
  be.linear(*be.pack_linear(W.data(), n, k, nullptr, WeightFormat::Int8), X.data(), m, k, got.data(), n);
  kernels::linear_int8(X.data(), m, k, kernels::pack_linear_int8(W.data(), n, k, k, nullptr), want.data(), n);
  EXPECT_TRUE(same_bits(got, want)) << "int8";

  std::vector<float> y(m * k), y_ref(m * k);
  be.rms_norm(X.data(), k, *be.pack_vector(g.data(), k), y.data(), k, m, 1e-5f);
  kernels::fused_rms_norm(X.data(), k, g.data(), y_ref.data(), k, m, k, 1e-5f);
  EXPECT_TRUE(same_bits(y, y_ref));
}

// RoPE + cache write then attention through the backend, against the kernels called per token as
// the fast path did before the seam; then the last-token layout reproduces the last rows.
TEST(InferenceBackend, RopeCacheAndAttentionAreTheKernelsBitwise) {
  const InferenceBackend& be = cpu_backend();
  const int64_t B = 2, T = 5, Hq = 4, Hkv = 2, D = 16, cap = 32, Q = Hq * D, KV = Hkv * D, QKV = Q + 2 * KV;
  const std::vector<int64_t> start{3, 0}, rows{1, 0};
  const std::vector<float> qkv0 = seeded(B * T * QKV, 5);
  const AttentionShape shape{Hq, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D))};
  auto tables = be.make_rope_tables(D, 10000.0f);
  const auto rope = tables->at_least(start[0] + T);
  EXPECT_GE(rope->positions(), start[0] + T);

  std::vector<float> qkv = qkv0, kc(B * Hkv * cap * D, 0.0f), vc(kc.size(), 0.0f), out(B * T * Q);
  KVLayerView view;
  view.k = kc.data();
  view.v = vc.data();
  view.k_row_bytes = view.v_row_bytes = D * 4;
  view.capacity = cap;
  const TokenLayout layout{B, T, 0, start.data(), rows.data()};
  be.rope_and_cache_write(qkv.data(), QKV, layout, *rope, shape, view);
  be.cached_attention(qkv.data(), QKV, out.data(), Q, layout, shape, view);

  const kernels::RopeTable table(D, 8192, 10000.0f);
  std::vector<float> rq = qkv0, rk(kc.size(), 0.0f), rv(kc.size(), 0.0f), rout(B * T * Q);
  const kernels::CachedAttention ks{Hq, Hkv, D, cap, shape.scale};
  for (int64_t i = 0; i < B * T; ++i) {
    const int64_t b = i / T, pos = start[b] + i % T, r = rows[b];
    float* row = rq.data() + i * QKV;
    kernels::fused_rope_inplace(row, Hq, table, pos);
    kernels::fused_rope_inplace(row + Q, Hkv, table, pos);
    for (int64_t g = 0; g < Hkv; ++g) {
      std::memcpy(rk.data() + ((r * Hkv + g) * cap + pos) * D, row + Q + g * D, D * 4);
      std::memcpy(rv.data() + ((r * Hkv + g) * cap + pos) * D, row + Q + KV + g * D, D * 4);
    }
  }
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t b = i / T, base = rows[b] * Hkv * cap * D;
      kernels::fused_attention_head(rq.data() + i * QKV + h * D, rk.data() + base, rv.data() + base,
                                    rout.data() + i * Q + h * D, h, start[b] + i % T, ks);
    }
  EXPECT_TRUE(same_bits(qkv, rq));
  EXPECT_TRUE(same_bits(kc, rk) && same_bits(vc, rv));
  EXPECT_TRUE(same_bits(out, rout));

  // Each row's last query alone, at offset T - 1, attends the same cache to the same bits.
  std::vector<float> q_last(B * QKV), out_last(B * Q);
  for (int64_t b = 0; b < B; ++b) std::memcpy(q_last.data() + b * QKV, qkv.data() + (b * T + T - 1) * QKV, Q * 4);
  be.cached_attention(q_last.data(), QKV, out_last.data(), Q, TokenLayout{B, 1, T - 1, start.data(), rows.data()},
                      shape, view);
  for (int64_t b = 0; b < B; ++b)
    EXPECT_EQ(std::memcmp(out_last.data() + b * Q, out.data() + (b * T + T - 1) * Q, Q * 4), 0) << "row " << b;
}

TEST(InferenceBackend, ScratchSlotsAreSeparateAndKeepTheirContents) {
  const InferenceBackend& be = cpu_backend();
  float* a = be.scratch(Scratch::QKV, 100);
  float* b = be.scratch(Scratch::Mid, 100);
  EXPECT_NE(a, b);
  a[99] = 3.5f;
  EXPECT_EQ(be.scratch(Scratch::QKV, 50), a);  // no regrowth for a smaller request
  EXPECT_EQ(be.scratch(Scratch::QKV, 100)[99], 3.5f);
}

TEST(InferenceBackend, HeadArgmaxMatchesTheHeadsLogitsAcrossBlocks) {
  const InferenceBackend& be = cpu_backend();
  const int64_t V = kCpuLmHeadBlock + 300, k = 32, n = 3;
  const std::vector<float> W = seeded(V * k, 6), h = seeded(n * k, 7);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::Int8}) {
    auto head = be.pack_head(W.data(), V, k, f);
    EXPECT_EQ(head->vocab(), V);
    std::vector<float> logits(n * V);
    be.lm_head(*head, h.data(), n, logits.data());
    for (int64_t limit : {int64_t{0}, int64_t{100}, V - 1}) {
      std::vector<int64_t> ids(n, -1);
      be.lm_head_argmax(*head, h.data(), n, ids.data(), limit);
      const int64_t lim = limit <= 0 ? V : limit;
      for (int64_t i = 0; i < n; ++i) {
        int64_t best = 0;
        for (int64_t j = 1; j < lim; ++j)
          if (logits[i * V + j] > logits[i * V + best]) best = j;
        EXPECT_EQ(ids[i], best) << "row " << i << " limit " << limit;
      }
    }
  }
}

}  // namespace
}  // namespace corelm::ops
