// KV cache block formats (kernels/cpu/kv_quant.h): round-trip error bounds per type, edge values,
// NaN/inf rules, the q4_0 byte layout, the turbo rotation (orthogonal, norm preserving) and
// codebook (Lloyd-Max optimality checked by independent integration); and the attention kernel
// that reads the codes in place (kv_attention.h) against the reference attention over the
// decoded cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "corelm/dtype.h"
#include "corelm/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/kv_attention.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/reference/fused.h"

namespace corelm::kernels {
namespace {

using corelm::testing::random_floats;

const std::vector<KVFormat> kAll = {KVFormat::F32,  KVFormat::BF16,   KVFormat::F16,   KVFormat::Q8_0,
                                    KVFormat::Q4_0, KVFormat::Turbo4, KVFormat::Turbo3};
const std::vector<KVFormat> kBlocked = {KVFormat::Q8_0, KVFormat::Q4_0, KVFormat::Turbo4, KVFormat::Turbo3};

std::vector<float> round_trip(KVFormat f, const std::vector<float>& x, int64_t d) {
  const int64_t rb = kv_row_bytes(f, d), rows = static_cast<int64_t>(x.size()) / d;
  std::vector<uint8_t> bytes(static_cast<size_t>(rb * rows), 0xAB);
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) kv_encode_row(f, x.data() + r * d, d, bytes.data() + r * rb);
  for (int64_t r = 0; r < rows; ++r) kv_decode_row(f, bytes.data() + r * rb, d, y.data() + r * d);
  return y;
}

double norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return std::sqrt(s);
}

TEST(KVQuant, InlineHalfDecodeMatchesCoreOnEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = kv_half_to_float(static_cast<uint16_t>(h)), b = f16_to_float(f16{static_cast<uint16_t>(h)});
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << h;
    } else {
      ASSERT_EQ(a, b) << "pattern " << h;
    }
  }
}

TEST(KVQuant, RowBytesAndHeadDimRules) {
  EXPECT_EQ(kv_row_bytes(KVFormat::F32, 64), 256);
  EXPECT_EQ(kv_row_bytes(KVFormat::BF16, 64), 128);
  EXPECT_EQ(kv_row_bytes(KVFormat::Q8_0, 64), 2 * (2 + 32));
  EXPECT_EQ(kv_row_bytes(KVFormat::Q4_0, 64), 2 * (2 + 16));
  EXPECT_EQ(kv_row_bytes(KVFormat::Turbo4, 128), 2 + 64);
  EXPECT_EQ(kv_row_bytes(KVFormat::Turbo3, 128), 2 + 48);
  EXPECT_EQ(kv_row_bytes(KVFormat::Turbo4, 256), 2 * (2 + 64));
  EXPECT_EQ(kv_block_values(KVFormat::Turbo3, 64), 64);  // one block per head below 128
  EXPECT_EQ(kv_row_bytes(KVFormat::Turbo3, 64), 2 + 24);
  EXPECT_THROW(kv_row_bytes(KVFormat::Q8_0, 48), ValueError);
  EXPECT_THROW(kv_row_bytes(KVFormat::Turbo4, 96), ValueError);
  EXPECT_THROW(kv_row_bytes(KVFormat::Turbo3, 4), ValueError);
  EXPECT_EQ(kv_row_bytes(KVFormat::F16, 6), 12);
}

// Per-value bounds from each format's definition, on Gaussian rows of several head sizes.
TEST(KVQuant, RoundTripErrorWithinTheFormatsBounds) {
  for (int64_t d : {32, 64, 128, 256}) {
    const std::vector<float> x = random_floats(static_cast<size_t>(d * 50), 7 + d, 3.0f);
    for (KVFormat f : kAll) {
      if (kv_format_is_turbo(f) && d == 32) continue;
      const std::vector<float> y = round_trip(f, x, d);
      if (f == KVFormat::F32) {
        EXPECT_EQ(x, y);
        continue;
      }
      if (f == KVFormat::BF16 || f == KVFormat::F16) {
        const double rel = f == KVFormat::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(x[i] - y[i]), rel * std::fabs(x[i]) + 1e-7) << i;
        continue;
      }
      if (f == KVFormat::Q8_0 || f == KVFormat::Q4_0) {
        for (size_t b = 0; b < x.size(); b += 32) {
          float amax = 0;
          for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
          // q8_0: half a step of amax/127 (+ the fp16 rounding of the scale, relative 2^-11, at
          // most 127 steps away); q4_0: one step of amax/8 (the clamped side of [-8, 7]).
          const double step = f == KVFormat::Q8_0 ? amax / 127.0 : amax / 8.0;
          const double bound = (f == KVFormat::Q8_0 ? 0.5 * step : step) + amax * std::ldexp(1.0, -10);
          for (size_t i = b; i < b + 32; ++i) ASSERT_LE(std::fabs(x[i] - y[i]), bound) << kv_format_name(f) << " " << i;
        }
        continue;
      }
      // Turbo: the norm of each block is kept (fp16 rounding of the scale), and the relative L2
      // error stays near the Lloyd-Max distortion of a unit Gaussian (4 bits: 0.0095 MSE -> 0.097
      // rms; 3 bits: 0.0345 -> 0.186), with a margin for the finite block.
      const int64_t n = kv_block_values(f, d);
      double err_sq = 0, ref_sq = 0;
      for (size_t b = 0; b < x.size(); b += static_cast<size_t>(n)) {
        const double nx = norm(x.data() + b, n), ny = norm(y.data() + b, n);
        ASSERT_NEAR(ny, nx, nx * std::ldexp(1.0, -10)) << kv_format_name(f) << " d=" << d;
        for (int64_t i = 0; i < n; ++i) {
          err_sq += std::pow(double(x[b + i]) - double(y[b + i]), 2);
          ref_sq += std::pow(double(x[b + i]), 2);
        }
      }
      const double rel = std::sqrt(err_sq / ref_sq);
      EXPECT_LT(rel, f == KVFormat::Turbo4 ? 0.12 : 0.22) << kv_format_name(f) << " d=" << d;
      EXPECT_GT(rel, f == KVFormat::Turbo4 ? 0.05 : 0.12) << "suspiciously exact: " << kv_format_name(f);
    }
  }
}

TEST(KVQuant, ZerosTinyAndLargeValues) {
  const int64_t d = 128;
  for (KVFormat f : kAll) {
    const std::vector<float> zeros(d, 0.0f);
    EXPECT_EQ(round_trip(f, zeros, d), zeros) << kv_format_name(f);
    // Tiny values (far below fp16's smallest subnormal) may flush to zero, never grow.
    std::vector<float> tiny = random_floats(d, 3, 1e-30f);
    for (float v : round_trip(f, tiny, d)) EXPECT_LE(std::fabs(v), 1e-29f) << kv_format_name(f);
  }
  // The largest block a fp16 scale still holds: q8_0 and q4_0 with a value of 65504 decode it finite.
  std::vector<float> big(d);
  for (int64_t i = 0; i < d; ++i) big[i] = (i % 2 ? -1.0f : 1.0f) * 65504.0f * float(i % 7) / 6.0f;
  for (KVFormat f : {KVFormat::Q8_0, KVFormat::Q4_0, KVFormat::Turbo4, KVFormat::Turbo3, KVFormat::F16}) {
    const std::vector<float> y = round_trip(f, big, d);
    for (int64_t i = 0; i < d; ++i) ASSERT_TRUE(std::isfinite(y[i])) << kv_format_name(f) << " " << i;
    if (!kv_format_is_turbo(f)) {
      EXPECT_NEAR(y[6], big[6], 65504.0 / 7.0) << kv_format_name(f);  // ±max keeps its sign and size
    }
  }
  // Past fp16's range: f16 rounds to inf (IEEE); the blocked formats turn the block into NaN
  // (documented in kv_quant.h) rather than clip it; bf16 keeps the value.
  std::vector<float> huge(d, 1.0f);
  huge[3] = -1e10f;
  EXPECT_TRUE(std::isinf(round_trip(KVFormat::F16, huge, d)[3]));
  EXPECT_NEAR(round_trip(KVFormat::BF16, huge, d)[3], -1e10, 1e10 * std::ldexp(1.0, -8));
  for (KVFormat f : kBlocked) EXPECT_TRUE(std::isnan(round_trip(f, huge, d)[3])) << kv_format_name(f);
  for (KVFormat f : {KVFormat::Q8_0, KVFormat::Q4_0})
    EXPECT_TRUE(std::isnan(round_trip(f, huge, d)[0])) << kv_format_name(f);   // same block
  for (KVFormat f : {KVFormat::Q8_0, KVFormat::Q4_0})
    EXPECT_NEAR(round_trip(f, huge, d)[40], 1.0f, 1e-3) << kv_format_name(f);  // another block
}

TEST(KVQuant, NaNAndInfinityMarkTheirBlock) {
  const int64_t d = 256;  // two turbo blocks, eight q blocks
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = random_floats(d, 11);
    x[5] = bad;
    for (KVFormat f : kAll) {
      const std::vector<float> y = round_trip(f, x, d);
      const int64_t n = kv_block_values(f, d);
      if (n == 1) {  // f32, bf16, f16: the value itself, IEEE style
        EXPECT_TRUE(std::isnan(bad) ? std::isnan(y[5]) : y[5] == bad) << kv_format_name(f);
        EXPECT_TRUE(std::isfinite(y[6])) << kv_format_name(f);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isnan(y[i])) << kv_format_name(f) << " " << i;
      for (int64_t i = n; i < d; ++i) ASSERT_TRUE(std::isfinite(y[i])) << kv_format_name(f) << " " << i;
    }
  }
}

TEST(KVQuant, Q4_0ByteLayoutIsLowNibblesThenHighNibbles) {
  std::vector<uint8_t> block(18);
  const uint16_t half = kv_float_to_half(0.5f);
  std::memcpy(block.data(), &half, 2);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> x(32);
  kv_decode_row(KVFormat::Q4_0, block.data(), 32, x.data());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], 0.5f * float(j - 8));
    EXPECT_EQ(x[j + 16], 0.5f * float(7 - j));
  }
  // Encoding the decoded block gives the same bytes back.
  std::vector<uint8_t> again(18);
  kv_encode_row(KVFormat::Q4_0, x.data(), 32, again.data());
  for (int j = 2; j < 18; ++j) EXPECT_EQ(again[j], block[j]) << j;
}

TEST(KVQuant, TurboRotationIsOrthogonal) {
  for (int64_t n : {8, 16, 32, 64, 128}) {
    std::vector<float> R(static_cast<size_t>(n * n));  // column j = R e_j
    for (int64_t j = 0; j < n; ++j) {
      std::vector<float> e(n, 0.0f);
      e[j] = 1.0f;
      turbo_rotate(e.data(), n);
      for (int64_t i = 0; i < n; ++i) R[i * n + j] = e[i];
    }
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = 0; b < n; ++b) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += double(R[a * n + i]) * double(R[b * n + i]);
        ASSERT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-6) << "n=" << n << " (" << a << ", " << b << ")";
      }
    std::vector<float> x = random_floats(n, 5 + n), y = x;
    turbo_rotate(y.data(), n);
    EXPECT_NEAR(norm(y.data(), n), norm(x.data(), n), 1e-5 * norm(x.data(), n));
    turbo_unrotate(y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
  }
  // The signs are the documented splitmix64 stream: both signs occur, and not in a simple pattern.
  int minus = 0;
  for (int64_t i = 0; i < kTurboMaxBlock; ++i) minus += turbo_signs()[i] < 0;
  EXPECT_GT(minus, 40);
  EXPECT_LT(minus, 88);
}

// Lloyd-Max conditions checked by integrating the Gaussian on a fine grid (independent of the
// closed form the code iterates): each level is its cell's conditional mean, and the levels are
// symmetric and ascending.
TEST(KVQuant, TurboCodebookIsLloydMaxForAGaussian) {
  for (int bits : {3, 4}) {
    const int L = 1 << bits;
    const float* c = turbo_codebook(bits);
    for (int k = 0; k < L; ++k) {
      EXPECT_NEAR(c[k], -c[L - 1 - k], 1e-6);
      if (k > 0) {
        EXPECT_LT(c[k - 1], c[k]);
      }
    }
    for (int k = 0; k < L; ++k) {
      const double a = k == 0 ? -12.0 : 0.5 * (c[k - 1] + c[k]);
      const double b = k == L - 1 ? 12.0 : 0.5 * (c[k] + c[k + 1]);
      double mass = 0, moment = 0;
      const int steps = 200000;
      const double h = (b - a) / steps;
      for (int i = 0; i <= steps; ++i) {
        const double t = a + i * h, w = (i == 0 || i == steps ? 0.5 : 1.0) * std::exp(-0.5 * t * t);
        mass += w;
        moment += w * t;
      }
      EXPECT_NEAR(c[k], moment / mass, 1e-5) << bits << " bits, level " << k;
    }
  }
  EXPECT_THROW(turbo_codebook(2), ValueError);
}

// The in-place attention kernel against the reference attention over the cache decoded to f32:
// the same numbers up to f32 summation order (and the query's rotation for turbo keys).
TEST(KVQuant, AttentionReadsCodesInPlaceLikeTheDecodedReference) {
  for (int64_t D : {64, 128}) {
    const int64_t Hq = 4, Hkv = 2, cap = 40;
    const CachedAttention shape{Hq, Hkv, D, cap, 1.0f / std::sqrt(float(D))};
    const std::vector<float> k = random_floats(static_cast<size_t>(Hkv * cap * D), 21, 2.0f);
    const std::vector<float> v = random_floats(static_cast<size_t>(Hkv * cap * D), 22);
    const std::vector<float> q = random_floats(static_cast<size_t>(Hq * D), 23, 2.0f);
    for (KVFormat kf : kAll)
      for (KVFormat vf : kAll) {  // every pair of equal types, plus some mixes
        if (kf != vf && kf != KVFormat::Q8_0 && vf != KVFormat::F32) continue;
        const int64_t krb = kv_row_bytes(kf, D), vrb = kv_row_bytes(vf, D);
        std::vector<uint8_t> kb(static_cast<size_t>(Hkv * cap * krb)), vb(static_cast<size_t>(Hkv * cap * vrb));
        std::vector<float> kd(k.size()), vd(v.size());
        for (int64_t e = 0; e < Hkv * cap; ++e) {
          kv_encode_row(kf, k.data() + e * D, D, kb.data() + e * krb);
          kv_encode_row(vf, v.data() + e * D, D, vb.data() + e * vrb);
          kv_decode_row(kf, kb.data() + e * krb, D, kd.data() + e * D);
          kv_decode_row(vf, vb.data() + e * vrb, D, vd.data() + e * D);
        }
        for (int64_t pos : {0, 17, 39})
          for (int64_t h = 0; h < Hq; ++h) {
            std::vector<float> got(D), want(D);
            quant_attention_head(q.data() + h * D, kb.data(), vb.data(), got.data(), h, pos, shape, {kf, vf});
            reference::fused_attention_head(q.data() + h * D, kd.data(), vd.data(), want.data(), h, pos, shape);
            for (int64_t i = 0; i < D; ++i)
              ASSERT_NEAR(got[i], want[i], 2e-5 * std::max(1.0f, std::fabs(want[i])))
                  << kv_format_name(kf) << "/" << kv_format_name(vf) << " D=" << D << " pos=" << pos << " head=" << h;
          }
      }
  }
}

}  // namespace
}  // namespace corelm::kernels
