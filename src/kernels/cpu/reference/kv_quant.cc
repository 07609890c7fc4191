// Reference encode/decode of the KV cache block formats (see kernels/cpu/kv_quant.h).
#include "kernels/cpu/kv_quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "corelm/dtype.h"
#include "corelm/error.h"

namespace corelm::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kHalfMax = 65504.0f;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void put_half(uint8_t* p, float v) {
  const uint16_t h = kv_float_to_half(v);
  std::memcpy(p, &h, 2);
}
float get_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return kv_half_to_float(h);
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// A scale that fp16 cannot hold (or a non-finite block) becomes NaN: see the header.
float storable_scale(float d, bool finite) { return finite && d <= kHalfMax ? d : kNaN; }

void encode_q8_0(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kQuantBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = storable_scale(amax / 127.0f, all_finite(x, kQuantBlock));
  put_half(out, d);
  // Quantize against the scale actually stored, so decode(encode(x)) is the nearest code.
  const float stored = get_half(out);
  const float inv = stored > 0.0f ? 1.0f / stored : 0.0f;  // NaN and zero scales store zero codes
  auto* codes = reinterpret_cast<int8_t*>(out + 2);
  for (int64_t i = 0; i < kQuantBlock; ++i) {
    const float q = std::nearbyint(x[i] * inv);
    codes[i] = static_cast<int8_t>(std::isfinite(q) ? std::clamp(q, -127.0f, 127.0f) : 0.0f);
  }
}

void decode_q8_0(const uint8_t* in, float* x) {
  const float d = get_half(in);
  const auto* codes = reinterpret_cast<const int8_t*>(in + 2);
  for (int64_t i = 0; i < kQuantBlock; ++i) x[i] = d * static_cast<float>(codes[i]);
}

// llama.cpp's q4_0 idea: the value of largest magnitude maps to code 0 (-8 * d with d = m / -8),
// so the asymmetric range [-8, 7] spends its extra level on that value's side.
void encode_q4_0(const float* x, uint8_t* out) {
  float m = 0.0f;
  for (int64_t i = 0; i < kQuantBlock; ++i)
    if (std::fabs(x[i]) > std::fabs(m)) m = x[i];
  const float d = m / -8.0f;
  put_half(out, all_finite(x, kQuantBlock) && std::fabs(d) <= kHalfMax ? d : kNaN);
  const float stored = get_half(out);
  const float inv = stored != 0.0f && std::isfinite(stored) ? 1.0f / stored : 0.0f;
  uint8_t* qs = out + 2;
  auto code = [&](float v) {
    const float q = std::nearbyint(v * inv) + 8.0f;
    return static_cast<uint8_t>(std::isfinite(q) ? std::clamp(q, 0.0f, 15.0f) : 8.0f);
  };
  for (int64_t j = 0; j < kQuantBlock / 2; ++j)
    qs[j] = static_cast<uint8_t>(code(x[j]) | (code(x[j + kQuantBlock / 2]) << 4));
}

void decode_q4_0(const uint8_t* in, float* x) {
  const float d = get_half(in);
  const uint8_t* qs = in + 2;
  for (int64_t j = 0; j < kQuantBlock / 2; ++j) {
    x[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    x[j + kQuantBlock / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Sylvester Walsh–Hadamard transform in place (unnormalised): n a power of two.
void fwht(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

void put_code(uint8_t* codes, int bits, int64_t i, int c) {
  if (bits == 4) {
    codes[i / 2] = static_cast<uint8_t>(i % 2 == 0 ? (codes[i / 2] & 0xf0) | c : (codes[i / 2] & 0x0f) | (c << 4));
    return;
  }
  uint8_t* g = codes + (i / 8) * 3;  // 8 codes in 24 bits
  uint32_t word = g[0] | (g[1] << 8) | (g[2] << 16);
  const int shift = static_cast<int>(i % 8) * 3;
  word = (word & ~(7u << shift)) | (static_cast<uint32_t>(c) << shift);
  g[0] = static_cast<uint8_t>(word), g[1] = static_cast<uint8_t>(word >> 8), g[2] = static_cast<uint8_t>(word >> 16);
}

int get_code(const uint8_t* codes, int bits, int64_t i) {
  if (bits == 4) return i % 2 == 0 ? codes[i / 2] & 0x0f : codes[i / 2] >> 4;
  const uint8_t* g = codes + (i / 8) * 3;
  const uint32_t word = g[0] | (g[1] << 8) | (g[2] << 16);
  return static_cast<int>((word >> ((i % 8) * 3)) & 7u);
}

void encode_turbo(const float* x, int64_t n, int bits, uint8_t* out) {
  const float* levels = turbo_codebook(bits);
  const int L = 1 << bits;
  uint8_t* codes = out + 2;
  std::fill(codes, codes + kv_block_bytes(bits == 4 ? KVFormat::Turbo4 : KVFormat::Turbo3, n) - 2, uint8_t{0});
  double norm_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) norm_sq += double(x[i]) * double(x[i]);
  const double norm = std::sqrt(norm_sq);
  if (!all_finite(x, n) || !std::isfinite(norm)) {
    put_half(out, kNaN);
    return;
  }
  std::array<float, kTurboMaxBlock> y;
  std::copy_n(x, n, y.begin());
  turbo_rotate(y.data(), n);
  const double to_unit = norm > 0.0 ? std::sqrt(double(n)) / norm : 0.0;
  double code_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double u = double(y[i]) * to_unit;
    int c = 0;  // the nearest level: levels ascend, so count the midpoints below u
    while (c + 1 < L && u > 0.5 * (double(levels[c]) + double(levels[c + 1]))) ++c;
    put_code(codes, bits, i, c);
    code_sq += double(levels[c]) * double(levels[c]);
  }
  const double s = norm > 0.0 ? norm / std::sqrt(code_sq) : 0.0;
  put_half(out, s <= kHalfMax ? static_cast<float>(s) : kNaN);
}

void decode_turbo(const uint8_t* in, int64_t n, int bits, float* x) {
  const float* levels = turbo_codebook(bits);
  const float s = get_half(in);
  for (int64_t i = 0; i < n; ++i) x[i] = s * levels[get_code(in + 2, bits, i)];
  turbo_unrotate(x, n);
}

// Lloyd's iteration for a standard Gaussian with L levels (see the header).
std::vector<float> lloyd_max_gaussian(int L) {
  const double inv_sqrt2 = 1.0 / std::sqrt(2.0), inv_sqrt2pi = 1.0 / std::sqrt(2.0 * M_PI);
  auto cdf = [&](double t) { return 0.5 * std::erfc(-t * inv_sqrt2); };
  auto pdf = [&](double t) { return std::isinf(t) ? 0.0 : inv_sqrt2pi * std::exp(-0.5 * t * t); };
  std::vector<double> c(static_cast<size_t>(L));
  for (int k = 0; k < L; ++k) c[k] = -3.0 + 6.0 * (k + 0.5) / L;  // a uniform start over ±3
  for (int iter = 0; iter < 10000; ++iter) {
    double moved = 0.0;
    for (int k = 0; k < L; ++k) {
      const double a = k == 0 ? -INFINITY : 0.5 * (c[k - 1] + c[k]);
      const double b = k == L - 1 ? INFINITY : 0.5 * (c[k] + c[k + 1]);
      // E[X | a < X < b] for X ~ N(0, 1): (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)).
      const double centroid = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a));
      moved = std::max(moved, std::fabs(centroid - c[k]));
      c[k] = centroid;
    }
    if (moved < 1e-13) break;
  }
  return std::vector<float>(c.begin(), c.end());
}

}  // namespace

uint16_t kv_float_to_half(float f) { return float_to_f16(f).bits; }

const char* kv_format_name(KVFormat f) {
  switch (f) {
    case KVFormat::F32: return "f32";
    case KVFormat::BF16: return "bf16";
    case KVFormat::F16: return "f16";
    case KVFormat::Q8_0: return "q8_0";
    case KVFormat::Q4_0: return "q4_0";
    case KVFormat::Turbo4: return "turbo4";
    case KVFormat::Turbo3: return "turbo3";
  }
  return "?";
}

bool kv_format_is_turbo(KVFormat f) { return f == KVFormat::Turbo4 || f == KVFormat::Turbo3; }
int turbo_bits(KVFormat f) { return f == KVFormat::Turbo4 ? 4 : 3; }

int64_t kv_block_values(KVFormat f, int64_t head_dim) {
  CORELM_CHECK(head_dim > 0, ValueError, "KV cache: head_dim must be positive, got ", head_dim);
  switch (f) {
    case KVFormat::F32:
    case KVFormat::BF16:
    case KVFormat::F16: return 1;
    case KVFormat::Q8_0:
    case KVFormat::Q4_0:
      CORELM_CHECK(head_dim % kQuantBlock == 0, ValueError, "KV cache type ", kv_format_name(f),
                   " needs a head_dim that is a multiple of ", kQuantBlock, ", got ", head_dim);
      return kQuantBlock;
    case KVFormat::Turbo4:
    case KVFormat::Turbo3: {
      if (head_dim % kTurboMaxBlock == 0) return kTurboMaxBlock;
      const bool pow2 = (head_dim & (head_dim - 1)) == 0;
      CORELM_CHECK(pow2 && head_dim >= 8, ValueError, "KV cache type ", kv_format_name(f),
                   " needs a head_dim that is a multiple of 128 or a power of two from 8 to 64, got ", head_dim);
      return head_dim;
    }
  }
  throw ValueError("KV cache: unknown format");
}

int64_t kv_block_bytes(KVFormat f, int64_t n) {
  switch (f) {
    case KVFormat::F32: return 4 * n;
    case KVFormat::BF16:
    case KVFormat::F16: return 2 * n;
    case KVFormat::Q8_0: return 2 + n;
    case KVFormat::Q4_0: return 2 + n / 2;
    case KVFormat::Turbo4: return 2 + n / 2;
    case KVFormat::Turbo3: return 2 + 3 * n / 8;
  }
  return 0;
}

int64_t kv_row_bytes(KVFormat f, int64_t head_dim) {
  const int64_t n = kv_block_values(f, head_dim);
  return head_dim / n * kv_block_bytes(f, n);
}

void kv_encode_row(KVFormat f, const float* x, int64_t d, uint8_t* out) {
  const int64_t n = kv_block_values(f, d), nb = kv_block_bytes(f, n);
  switch (f) {
    case KVFormat::F32: std::memcpy(out, x, static_cast<size_t>(d) * 4); return;
    case KVFormat::BF16:
      for (int64_t i = 0; i < d; ++i) {
        const uint16_t b = float_to_bf16(x[i]).bits;
        std::memcpy(out + 2 * i, &b, 2);
      }
      return;
    case KVFormat::F16:
      for (int64_t i = 0; i < d; ++i) put_half(out + 2 * i, x[i]);
      return;
    case KVFormat::Q8_0:
      for (int64_t b = 0; b < d / n; ++b) encode_q8_0(x + b * n, out + b * nb);
      return;
    case KVFormat::Q4_0:
      for (int64_t b = 0; b < d / n; ++b) encode_q4_0(x + b * n, out + b * nb);
      return;
    case KVFormat::Turbo4:
    case KVFormat::Turbo3:
      for (int64_t b = 0; b < d / n; ++b) encode_turbo(x + b * n, n, turbo_bits(f), out + b * nb);
      return;
  }
}

void kv_decode_row(KVFormat f, const uint8_t* in, int64_t d, float* x) {
  const int64_t n = kv_block_values(f, d), nb = kv_block_bytes(f, n);
  switch (f) {
    case KVFormat::F32: std::memcpy(x, in, static_cast<size_t>(d) * 4); return;
    case KVFormat::BF16:
      for (int64_t i = 0; i < d; ++i) {
        uint16_t b;
        std::memcpy(&b, in + 2 * i, 2);
        x[i] = bf16_to_float(bf16{b});
      }
      return;
    case KVFormat::F16:
      for (int64_t i = 0; i < d; ++i) x[i] = get_half(in + 2 * i);
      return;
    case KVFormat::Q8_0:
      for (int64_t b = 0; b < d / n; ++b) decode_q8_0(in + b * nb, x + b * n);
      return;
    case KVFormat::Q4_0:
      for (int64_t b = 0; b < d / n; ++b) decode_q4_0(in + b * nb, x + b * n);
      return;
    case KVFormat::Turbo4:
    case KVFormat::Turbo3:
      for (int64_t b = 0; b < d / n; ++b) decode_turbo(in + b * nb, n, turbo_bits(f), x + b * n);
      return;
  }
}

const float* turbo_signs() {
  static const std::array<float, kTurboMaxBlock> signs = [] {
    std::array<float, kTurboMaxBlock> s{};
    for (int64_t i = 0; i < kTurboMaxBlock; ++i)
      s[i] = (splitmix64(kTurboSignSeed + static_cast<uint64_t>(i)) >> 63) ? -1.0f : 1.0f;
    return s;
  }();
  return signs.data();
}

// R = H S / sqrt(n): signs first, then the transform. Rᵀ = S H / sqrt(n) (H is symmetric).
void turbo_rotate(float* x, int64_t n) {
  const float* s = turbo_signs();
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= s[i];
  fwht(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= norm;
}

void turbo_unrotate(float* x, int64_t n) {
  const float* s = turbo_signs();
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  fwht(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= s[i] * norm;
}

const float* turbo_codebook(int bits) {
  CORELM_CHECK(bits == 3 || bits == 4, ValueError, "turbo_codebook: bits must be 3 or 4, got ", bits);
  static const std::vector<float> b3 = lloyd_max_gaussian(8);
  static const std::vector<float> b4 = lloyd_max_gaussian(16);
  return bits == 4 ? b4.data() : b3.data();
}

}  // namespace corelm::kernels
