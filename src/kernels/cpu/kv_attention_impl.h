// The body of quant_attention_head (kv_attention.h), included once per instruction set: by
// kv_attention.cc for baseline x86-64 and by avx512/kv_attention.cc with AVX-512 flags, where the
// compiler maps the fixed 8-lane sums and the conversions onto wider registers. Everything here
// has internal linkage, so the two builds never mix. The includer defines
// CORELM_KV_ATTENTION_NAME, the name of the function to define in corelm::kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernels/cpu/kv_attention.h"

namespace corelm::kernels {
namespace {


// Local copies of the 16-bit conversions: this file is compiled once per ISA, and an inline
// function shared between differently-flagged translation units could be linked from the wrong one.
inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, em = h & 0x7fffu;
  if (em >= 0x7c00u) return bits_to_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u) return bits_to_float(sign | ((em << 13) + ((127u - 15u) << 23)));
  const float v = static_cast<float>(em) * 5.9604644775390625e-8f;  // subnormal: em * 2^-24
  return sign ? -v : v;
#endif
}
inline float bf16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}

// The 8 codes of one 3-byte turbo3 group.
inline void unpack3(const uint8_t* g, int* c) {
  const uint32_t w = g[0] | (g[1] << 8) | (g[2] << 16);
  for (int i = 0; i < 8; ++i) c[i] = static_cast<int>((w >> (3 * i)) & 7u);
}

// Σ q[i]·x(i) over i < n in 8 lanes added pairwise at the end: a fixed order (so results stay
// reproducible) that the compiler can keep in vector registers without reassociating floats.
// A tail of n % 8 values is added last, in order.
template <class Load>
inline float dot8(const float* q, int64_t n, Load&& x) {
  float lane[8] = {};
  const int64_t body = n - n % 8;
  for (int64_t i = 0; i < body; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += q[i + k] * x(i + k);
  float sum = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  for (int64_t i = body; i < n; ++i) sum += q[i] * x(i);
  return sum;
}

// q · x̂ for one encoded head vector of D values (q already rotated for the turbo formats).
template <KVFormat F>
float dot_row(const float* q, const uint8_t* row, int64_t D, int64_t n, const float* levels) {
  float acc = 0.0f;
  if constexpr (F == KVFormat::F32) {
    acc = dot8(q, D, [&](int64_t i) {
      float x;
      std::memcpy(&x, row + 4 * i, 4);
      return x;
    });
  } else if constexpr (F == KVFormat::BF16) {
    acc = dot8(q, D, [&](int64_t i) { return bf16_at(row + 2 * i); });
  } else if constexpr (F == KVFormat::F16) {
    acc = dot8(q, D, [&](int64_t i) { return half_at(row + 2 * i); });
  } else if constexpr (F == KVFormat::Q8_0) {
    for (int64_t b = 0; b < D; b += kQuantBlock, row += 2 + kQuantBlock) {
      const auto* c = reinterpret_cast<const int8_t*>(row + 2);
      acc += dot8(q + b, kQuantBlock, [&](int64_t i) { return static_cast<float>(c[i]); }) * half_at(row);
    }
  } else if constexpr (F == KVFormat::Q4_0) {
    constexpr int64_t h = kQuantBlock / 2;
    for (int64_t b = 0; b < D; b += kQuantBlock, row += 2 + h) {
      const uint8_t* c = row + 2;
      const float lo = dot8(q + b, h, [&](int64_t j) { return static_cast<float>((c[j] & 0x0f) - 8); });
      const float hi = dot8(q + b + h, h, [&](int64_t j) { return static_cast<float>((c[j] >> 4) - 8); });
      acc += (lo + hi) * half_at(row);
    }
  } else if constexpr (F == KVFormat::Turbo4) {
    for (int64_t b = 0; b < D; b += n, row += 2 + n / 2) {
      const uint8_t* c = row + 2;
      const float s = dot8(q + b, n, [&](int64_t i) { return levels[(c[i / 2] >> (4 * (i % 2))) & 0x0f]; });
      acc += s * half_at(row);
    }
  } else {  // Turbo3
    for (int64_t b = 0; b < D; b += n, row += 2 + 3 * n / 8) {
      const uint8_t* g = row + 2;
      float s = 0.0f;
      int c[8];
      for (int64_t j = 0; j < n; j += 8, g += 3) {
        unpack3(g, c);
        float lane = 0.0f;
        for (int i = 0; i < 8; ++i) lane += q[b + j + i] * levels[c[i]];
        s += lane;
      }
      acc += s * half_at(row);
    }
  }
  return acc;
}

// acc += w · x̂ for one encoded head vector (in the rotated basis for the turbo formats).
template <KVFormat F>
void axpy_row(float w, const uint8_t* row, int64_t D, int64_t n, const float* levels, float* acc) {
  if constexpr (F == KVFormat::F32) {
    for (int64_t i = 0; i < D; ++i) {
      float x;
      std::memcpy(&x, row + 4 * i, 4);
      acc[i] += w * x;
    }
  } else if constexpr (F == KVFormat::BF16) {
    for (int64_t i = 0; i < D; ++i) acc[i] += w * bf16_at(row + 2 * i);
  } else if constexpr (F == KVFormat::F16) {
    for (int64_t i = 0; i < D; ++i) acc[i] += w * half_at(row + 2 * i);
  } else if constexpr (F == KVFormat::Q8_0) {
    for (int64_t b = 0; b < D; b += kQuantBlock, row += 2 + kQuantBlock) {
      const auto* c = reinterpret_cast<const int8_t*>(row + 2);
      const float ws = w * half_at(row);
      for (int64_t i = 0; i < kQuantBlock; ++i) acc[b + i] += ws * static_cast<float>(c[i]);
    }
  } else if constexpr (F == KVFormat::Q4_0) {
    constexpr int64_t h = kQuantBlock / 2;
    for (int64_t b = 0; b < D; b += kQuantBlock, row += 2 + h) {
      const uint8_t* c = row + 2;
      const float ws = w * half_at(row);
      for (int64_t j = 0; j < h; ++j) {
        acc[b + j] += ws * static_cast<float>((c[j] & 0x0f) - 8);
        acc[b + h + j] += ws * static_cast<float>((c[j] >> 4) - 8);
      }
    }
  } else if constexpr (F == KVFormat::Turbo4) {
    for (int64_t b = 0; b < D; b += n, row += 2 + n / 2) {
      const uint8_t* c = row + 2;
      const float ws = w * half_at(row);
      for (int64_t j = 0; j < n / 2; ++j) {
        acc[b + 2 * j] += ws * levels[c[j] & 0x0f];
        acc[b + 2 * j + 1] += ws * levels[c[j] >> 4];
      }
    }
  } else {  // Turbo3
    for (int64_t b = 0; b < D; b += n, row += 2 + 3 * n / 8) {
      const uint8_t* g = row + 2;
      const float ws = w * half_at(row);
      int c[8];
      for (int64_t j = 0; j < n; j += 8, g += 3) {
        unpack3(g, c);
        for (int i = 0; i < 8; ++i) acc[b + j + i] += ws * levels[c[i]];
      }
    }
  }
}

template <KVFormat F>
void scores_of(const float* q, const uint8_t* K, int64_t rb, int64_t keys, int64_t D, int64_t n, float scale,
               float* s) {
  const float* levels = kv_format_is_turbo(F) ? turbo_codebook(turbo_bits(F)) : nullptr;
  for (int64_t j = 0; j < keys; ++j) s[j] = dot_row<F>(q, K + j * rb, D, n, levels) * scale;
}

template <KVFormat F>
void values_of(const float* p, const uint8_t* V, int64_t rb, int64_t keys, int64_t D, int64_t n, float* acc) {
  const float* levels = kv_format_is_turbo(F) ? turbo_codebook(turbo_bits(F)) : nullptr;
  for (int64_t j = 0; j < keys; ++j) axpy_row<F>(p[j], V + j * rb, D, n, levels, acc);
}

// Calls f with the format as a compile-time constant.
template <class Fn>
void with_format(KVFormat f, Fn&& fn) {
  switch (f) {
    case KVFormat::F32: return fn(std::integral_constant<KVFormat, KVFormat::F32>{});
    case KVFormat::BF16: return fn(std::integral_constant<KVFormat, KVFormat::BF16>{});
    case KVFormat::F16: return fn(std::integral_constant<KVFormat, KVFormat::F16>{});
    case KVFormat::Q8_0: return fn(std::integral_constant<KVFormat, KVFormat::Q8_0>{});
    case KVFormat::Q4_0: return fn(std::integral_constant<KVFormat, KVFormat::Q4_0>{});
    case KVFormat::Turbo4: return fn(std::integral_constant<KVFormat, KVFormat::Turbo4>{});
    case KVFormat::Turbo3: return fn(std::integral_constant<KVFormat, KVFormat::Turbo3>{});
  }
}

}  // namespace

void CORELM_KV_ATTENTION_NAME(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape, QuantCacheFormats formats) {
  const int64_t D = shape.head_dim, keys = pos + 1;
  const int64_t kv_head = head / (shape.q_heads / shape.kv_heads);
  const int64_t krb = kv_row_bytes(formats.k, D), vrb = kv_row_bytes(formats.v, D);
  const int64_t kn = kv_block_values(formats.k, D), vn = kv_block_values(formats.v, D);
  const uint8_t* K = k_cache + kv_head * shape.capacity * krb;
  const uint8_t* V = v_cache + kv_head * shape.capacity * vrb;
  thread_local std::vector<float> scores, qr, acc;
  if (static_cast<int64_t>(scores.size()) < keys) scores.resize(static_cast<size_t>(keys));
  qr.assign(q, q + D);
  acc.assign(static_cast<size_t>(D), 0.0f);
  if (kv_format_is_turbo(formats.k))
    for (int64_t b = 0; b < D; b += kn) turbo_rotate(qr.data() + b, kn);

  with_format(formats.k, [&](auto F) { scores_of<decltype(F)::value>(qr.data(), K, krb, keys, D, kn, shape.scale, scores.data()); });
  float m = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) m = std::max(m, scores[j]);
  float total = 0.0f;
  for (int64_t j = 0; j < keys; ++j) {
    scores[j] = std::exp(scores[j] - m);
    total += scores[j];
  }
  with_format(formats.v, [&](auto F) { values_of<decltype(F)::value>(scores.data(), V, vrb, keys, D, vn, acc.data()); });
  if (kv_format_is_turbo(formats.v))
    for (int64_t b = 0; b < D; b += vn) turbo_unrotate(acc.data() + b, vn);
  const float inv = 1.0f / total;
  for (int64_t i = 0; i < D; ++i) out[i] = acc[i] * inv;
}

}  // namespace corelm::kernels
