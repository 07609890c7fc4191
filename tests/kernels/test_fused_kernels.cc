// Fused inference kernels (kernels/cpu/fused.h) on every ISA path this CPU supports, against the
// op reference kernels (RMSNorm, RoPE, SwiGLU, causal attention) they must agree with; plus the
// invariances the model's batch-invariance guarantee rests on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "corelm/error.h"
#include "corelm/isa.h"
#include "corelm/random.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/reference/activation.h"
#include "kernels/cpu/reference/attention.h"
#include "kernels/cpu/reference/norm.h"
#include "kernels/cpu/reference/rope.h"

namespace corelm::kernels {
namespace {

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  Generator gen(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(gen.normal()) * scale;
  return v;
}

// max |a - b| / max(1, max |b|)
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::fabs(double(b[i])));
  }
  return diff / ref;
}

class FusedKernels : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { scoped_ = std::make_unique<ScopedIsa>(GetParam()); }
  void TearDown() override { scoped_.reset(); }
  std::unique_ptr<ScopedIsa> scoped_;
};

TEST_P(FusedKernels, RmsNormMatchesReferenceWithStridesAndTails) {
  for (int64_t d : {256, 37, 16}) {
    const int64_t rows = 5, ld = d + 3;
    auto x = random_floats(rows * ld, 1 + d, 3.0f), w = random_floats(d, 2 + d);
    std::vector<float> y(rows * ld, -7.0f), want(rows * d), got(rows * d);
    fused_rms_norm(x.data(), ld, w.data(), y.data(), ld, rows, d, 1e-5f);
    std::vector<float> packed(rows * d);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(x.data() + r * ld, d, packed.data() + r * d);
    reference::rms_norm_forward(packed.data(), w.data(), want.data(), nullptr, rows, d, 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(y.data() + r * ld, d, got.data() + r * d);
      for (int64_t j = d; j < ld; ++j) ASSERT_EQ(y[r * ld + j], -7.0f) << "wrote past the row, d=" << d;
    }
    EXPECT_LE(max_rel_diff(got, want), 2e-6) << "d=" << d;
  }
}

TEST_P(FusedKernels, RopeIsBitwiseTheReferenceRotation) {
  for (int64_t d : {64, 40}) {
    const int64_t heads = 3;
    RopeTable table(d, 300, 10000.0f);
    for (int64_t pos : {0, 1, 17, 299}) {
      auto x = random_floats(heads * d, 10 + pos);
      std::vector<float> want(x.size());
      reference::rope_apply(x.data(), want.data(), heads, 1, d, 10000.0f, pos, false);
      fused_rope_inplace(x.data(), heads, table, pos);
      EXPECT_EQ(0, std::memcmp(x.data(), want.data(), x.size() * sizeof(float))) << "d=" << d << " pos=" << pos;
    }
  }
}

TEST_P(FusedKernels, SwigluMatchesReference) {
  const int64_t rows = 3, n = 200;
  auto gu = random_floats(rows * 2 * n, 5, 4.0f);
  std::vector<float> got(rows * n), want(rows * n);
  fused_swiglu(gu.data(), 2 * n, got.data(), n, rows, n);
  for (int64_t r = 0; r < rows; ++r)
    reference::swiglu_forward(gu.data() + r * 2 * n, gu.data() + r * 2 * n + n, want.data() + r * n, n);
  EXPECT_LE(max_rel_diff(got, want), 1e-6);
}

// Fills a [kv_heads, capacity, D] cache with the reference's [1, kv_heads, S, D] keys/values.
struct AttentionCase {
  int64_t q_heads, kv_heads, D, S, T;
};

TEST_P(FusedKernels, AttentionMatchesReferenceCausalAttention) {
  for (AttentionCase c : {AttentionCase{4, 2, 64, 1, 1}, AttentionCase{4, 2, 64, 37, 37}, AttentionCase{9, 3, 64, 300, 1},
                          AttentionCase{4, 4, 16, 33, 17}, AttentionCase{2, 1, 40, 20, 5}, AttentionCase{8, 2, 128, 64, 16}}) {
    const int64_t cap = c.S + 5, D = c.D;
    auto q = random_floats(c.q_heads * c.T * D, 21, 2.0f);  // reference layout [Hq, T, D]
    auto k = random_floats(c.kv_heads * c.S * D, 22, 2.0f);
    auto v = random_floats(c.kv_heads * c.S * D, 23);
    std::vector<float> want(q.size());
    reference::AttentionDims dims{1, c.q_heads, c.kv_heads, c.T, c.S, D};
    const float scale = 1.0f / std::sqrt(float(D));
    reference::causal_attention_forward(q.data(), k.data(), v.data(), want.data(), dims, scale);

    std::vector<float> kc(c.kv_heads * cap * D, NAN), vc(kc.size(), NAN), qt(q.size()), got(q.size());
    for (int64_t g = 0; g < c.kv_heads; ++g) {
      std::copy_n(k.data() + g * c.S * D, c.S * D, kc.data() + g * cap * D);
      std::copy_n(v.data() + g * c.S * D, c.S * D, vc.data() + g * cap * D);
    }
    for (int64_t h = 0; h < c.q_heads; ++h)  // to token-major [T, Hq * D]
      for (int64_t t = 0; t < c.T; ++t) std::copy_n(q.data() + (h * c.T + t) * D, D, qt.data() + (t * c.q_heads + h) * D);
    CachedAttention shape{c.q_heads, c.kv_heads, D, cap, scale};
    fused_attention(qt.data(), c.q_heads * D, kc.data(), vc.data(), got.data(), c.q_heads * D, c.T, c.S - c.T, shape);
    std::vector<float> back(got.size());
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t t = 0; t < c.T; ++t) std::copy_n(got.data() + (t * c.q_heads + h) * D, D, back.data() + (h * c.T + t) * D);
    EXPECT_LE(max_rel_diff(back, want), 2e-6) << "Hq=" << c.q_heads << " D=" << D << " S=" << c.S << " T=" << c.T;
  }
}

// A query's result is the same bits whether it is the last of a prefill block or decoded alone,
// and whatever the thread count: what batch invariance of the model needs from attention.
TEST_P(FusedKernels, AttentionIsInvariantToBlockingAndThreads) {
  const int64_t Hq = 4, Hkv = 2, D = 64, S = 70, cap = 80;
  auto q = random_floats(S * Hq * D, 31), kc = random_floats(Hkv * cap * D, 32), vc = random_floats(Hkv * cap * D, 33);
  CachedAttention shape{Hq, Hkv, D, cap, 0.125f};
  std::vector<float> all(q.size()), one(Hq * D), two_threads(q.size());
  fused_attention(q.data(), Hq * D, kc.data(), vc.data(), all.data(), Hq * D, S, 0, shape);
  for (int64_t t : {0, 15, 16, 69}) {
    fused_attention(q.data() + t * Hq * D, Hq * D, kc.data(), vc.data(), one.data(), Hq * D, 1, t, shape);
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + t * Hq * D, one.size() * sizeof(float))) << "t=" << t;
  }
  set_num_threads(2);
  fused_attention(q.data(), Hq * D, kc.data(), vc.data(), two_threads.data(), Hq * D, S, 0, shape);
  set_num_threads(1);
  EXPECT_EQ(0, std::memcmp(all.data(), two_threads.data(), all.size() * sizeof(float)));
}

TEST_P(FusedKernels, BadShapesAreErrors) {
  CachedAttention shape{4, 3, 64, 10, 0.125f};  // 4 heads cannot share 3 kv heads
  std::vector<float> buf(4 * 64 * 10);
  EXPECT_THROW(fused_attention(buf.data(), 256, buf.data(), buf.data(), buf.data(), 256, 1, 0, shape), ValueError);
  shape.kv_heads = 2;
  EXPECT_THROW(fused_attention(buf.data(), 256, buf.data(), buf.data(), buf.data(), 256, 2, 9, shape), ValueError);
  RopeTable table(64, 8, 10000.0f);
  EXPECT_THROW(fused_rope_inplace(buf.data(), 1, table, 8), ValueError);
  EXPECT_THROW(RopeTable(63, 8, 10000.0f), ValueError);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedKernels, ::testing::ValuesIn(supported_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace corelm::kernels
