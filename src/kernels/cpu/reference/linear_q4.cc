#include "kernels/cpu/reference/linear_q4.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "corelm/dtype.h"
#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {

float fp16_value(uint16_t bits) { return f16_to_float(f16{bits}); }

namespace {

// fp16 rounding of v; false if it overflows (fp16 tops out at 65504).
bool to_fp16(float v, uint16_t& bits) {
  bits = float_to_f16(v).bits;
  return std::isfinite(fp16_value(bits));
}

}  // namespace

bool quantize_weight_block_q4(const float* w, int64_t len, Q4Format format, uint8_t* codes, uint16_t& scale,
                              uint16_t& min) {
  for (int64_t t = 0; t < len; ++t)
    if (!std::isfinite(w[t])) return false;
  scale = min = 0;
  if (format == Q4Format::Symmetric) {
    // The extreme value lands on code 0 (-8) exactly, so the block uses all 16 levels: a step of
    // max/8 rather than the max/7 of a [-7, 7] code.
    float extreme = 0.0f;
    for (int64_t t = 0; t < len; ++t)
      if (std::fabs(w[t]) > std::fabs(extreme)) extreme = w[t];
    if (!to_fp16(extreme / -8.0f, scale)) return false;
    const float d = fp16_value(scale);
    for (int64_t t = 0; t < len; ++t) {
      const float q = d == 0.0f ? 0.0f : std::clamp(std::nearbyint(w[t] / d), -8.0f, 7.0f);
      codes[t] = static_cast<uint8_t>(static_cast<int>(q) + 8);
    }
    return true;
  }
  const auto [lo, hi] = std::minmax_element(w, w + len);
  if (!to_fp16((*hi - *lo) / 15.0f, scale) || !to_fp16(*lo, min)) return false;
  const float d = fp16_value(scale), m = fp16_value(min);
  for (int64_t t = 0; t < len; ++t) {
    const float q = d == 0.0f ? 0.0f : std::clamp(std::nearbyint((w[t] - m) / d), 0.0f, 15.0f);
    codes[t] = static_cast<uint8_t>(q);
  }
  return true;
}

float quantize_activation_block_q8(const float* x, int64_t len, int8_t* q, int32_t& sum) {
  float a = 0.0f;
  bool finite = true;
  for (int64_t t = 0; t < len; ++t) {
    finite &= std::isfinite(x[t]);
    a = std::max(a, std::fabs(x[t]));
  }
  sum = 0;
  if (a == 0.0f || !finite) {
    for (int64_t t = 0; t < len; ++t) q[t] = 0;
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / a;
  for (int64_t t = 0; t < len; ++t) {
    q[t] = static_cast<int8_t>(std::clamp(std::nearbyint(x[t] * inv), -127.0f, 127.0f));
    sum += q[t];
  }
  return a / 127.0f;
}

void quantize_activation_rows_q8(const float* X, int64_t m, int64_t ldx, int64_t k, int64_t kp, int8_t* xq,
                                 float* xscale, int32_t* xsum) {
  const int64_t nb = kp / kQ4Block;
  for (int64_t i = 0; i < m; ++i) {
    int8_t* q = xq + i * kp;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t t0 = b * kQ4Block, len = std::min(kQ4Block, k - t0);
      xscale[i * nb + b] = quantize_activation_block_q8(X + i * ldx + t0, len, q + t0, xsum[i * nb + b]);
    }
    for (int64_t t = k; t < kp; ++t) q[t] = 0;
  }
}

void linear_q4(const float* X, int64_t m, int64_t ldx, const PackedLinearQ4& W, float* Y, int64_t ldy) {
  const int64_t n = W.n, k = W.k, kp = W.k_padded, nb = kp / kQ4Block;
  const bool with_min = W.format == Q4Format::WithMin;
  parallel_for(m, 1, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> q(static_cast<size_t>(kp));
    std::vector<float> xs(static_cast<size_t>(nb));
    std::vector<int32_t> sums(static_cast<size_t>(nb));
    for (int64_t i = begin; i < end; ++i) {
      quantize_activation_rows_q8(X + i * ldx, 1, ldx, k, kp, q.data(), xs.data(), sums.data());
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          int32_t dot = 0;
          for (int64_t t = b * kQ4Block; t < (b + 1) * kQ4Block; ++t) {
            const int code = (W.codes[q4_code_index(kp, j, t)] >> q4_code_shift(t)) & 0x0f;
            dot += code * int32_t{q[t]};
          }
          const int64_t s = q4_scale_index(kp, j, b);
          const float d = fp16_value(W.scale[s]);
          if (with_min) {
            acc = std::fma(static_cast<float>(dot), xs[b] * d, acc);
            acc = std::fma(static_cast<float>(sums[b]), xs[b] * fp16_value(W.min[s]), acc);
          } else {
            acc = std::fma(static_cast<float>(dot - 8 * sums[b]), xs[b] * d, acc);
          }
        }
        Y[i * ldy + j] = acc + (W.bias.empty() ? 0.0f : W.bias[j]);
      }
    }
  });
}

}  // namespace corelm::kernels::reference
