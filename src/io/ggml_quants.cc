// Block codecs for ggml's quantised tensor types. Layouts (little-endian, f16 = IEEE half):
//
//   Q4_0  32 values, 18 B: d, qs[16]           x = d * (q - 8),  q 4-bit
//   Q4_1  32 values, 20 B: d, m, qs[16]        x = d * q + m,    q 4-bit
//   Q5_0  32 values, 22 B: d, qh(u32), qs[16]  x = d * (q - 16), q 5-bit (bit 4 in qh)
//   Q5_1  32 values, 24 B: d, m, qh, qs[16]    x = d * q + m,    q 5-bit
//   Q8_0  32 values, 34 B: d, qs[32] (int8)    x = d * q
// In the 32-value types byte j of qs holds value j in its low nibble and value j+16 in its high
// nibble; bit j of qh is bit 4 of value j.
//
// The k-quants hold 256 values ("super-block") in sub-blocks of 16 or 32, each with a small
// integer scale (and min) that multiplies the super-block's f16 scale:
//   Q2_K  84 B: scales[16] (low nibble: scale, high: min), qs[64] (2-bit), d, dmin
//                x = (d * sc) * q - (dmin * m), sub-blocks of 16
//   Q3_K 110 B: hmask[32], qs[64] (low 2 bits), scales[12] (16 x 6-bit, signed by -32), d
//                x = (d * sc) * q, q = low2 - (hmask bit clear ? 4 : 0), sub-blocks of 16
//   Q4_K 144 B: d, dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128] (4-bit)
//                x = (d * sc) * q - (dmin * m), sub-blocks of 32
//   Q5_K 176 B: as Q4_K plus qh[32] (bit 4 of each value) before qs
//   Q6_K 210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d
//                x = (d * sc) * (q - 32), sub-blocks of 16
// Where values go inside a k-quant super-block is spelled out beside each decoder. The float32
// operation order of each formula matters for bit-exactness with the reference decoder.
#include "io/ggml_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace corelm::io {

namespace {

constexpr int64_t QK = 32, QKK = 256;

float load_f16(const uint8_t* p) {
  f16 h;
  std::memcpy(&h, p, 2);
  return f16_to_float(h);
}
void store_f16(uint8_t* p, float v) {
  const f16 h = float_to_f16(v);
  std::memcpy(p, &h, 2);
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_K/Q5_K's 12 scale bytes: 8 six-bit scales and 8 six-bit mins. Bytes 0-3 hold scales 0-3
// (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for the mins; bytes 8-11
// the low 4 bits of scale 4+j (low nibble) and of min 4+j (high nibble).
void unpack_k_scales(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((s[j + 8] & 15) | ((s[j] >> 6) << 4));
    mn[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}
void pack_k_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

int nearest(float v) { return static_cast<int>(std::nearbyint(v)); }

// ---- affine fit for the encoders ----------------------------------------------------------
// A group of values is coded as x ~ scale * q - offset with q in 0..nmax. The search: start
// from the group's range [min(0, lo), hi] (the k-quants need offset >= 0), then try shrinking the
// top of the range in 5% steps (clipping a few outliers often lowers the error of the rest), and
// keep the candidate with the least squared error. Returns scale and offset.
struct Affine {
  float scale = 0, offset = 0;
};
Affine fit_affine(const float* x, int n, int nmax, bool offset_nonneg) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  if (offset_nonneg) lo = std::min(lo, 0.0f);
  Affine best{(hi - lo) / nmax, -lo};
  if (hi == lo) return {0, -lo};
  double best_err = -1;
  for (int k = 0; k < 8; ++k) {
    const float scale = (hi - lo) * (1.0f - 0.05f * k) / nmax;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const int q = std::clamp(nearest((x[i] - lo) / scale), 0, nmax);
      const double e = scale * q + lo - x[i];
      err += e * e;
    }
    if (best_err < 0 || err < best_err) best_err = err, best = {scale, -lo};
  }
  return best;
}

// A group coded symmetrically as x ~ scale * q, q in -half..half-1: the value of largest
// magnitude maps to -half (so the sign of `scale` carries the asymmetry), then a 5%-step search
// over smaller scales as above.
float fit_symmetric(const float* x, int n, int half) {
  float amax = 0, mx = 0;
  for (int i = 0; i < n; ++i)
    if (std::abs(x[i]) > amax) amax = std::abs(x[i]), mx = x[i];
  if (amax == 0) return 0;
  float best = mx / -half;
  double best_err = -1;
  for (int k = 0; k < 8; ++k) {
    const float scale = mx / -half * (1.0f - 0.05f * k);
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const int q = std::clamp(nearest(x[i] / scale), -half, half - 1);
      const double e = scale * q - x[i];
      err += e * e;
    }
    if (best_err < 0 || err < best_err) best_err = err, best = scale;
  }
  return best;
}

}  // namespace

// ---- 32-value types ------------------------------------------------------------------------

void dequantize_q8_0(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / QK; ++b, in += 34, y += QK) {
    const float d = load_f16(in);
    for (int64_t j = 0; j < QK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(in[2 + j])) * d;
  }
}
void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / QK; ++b, x += QK, out += 34) {
    float amax = 0;
    for (int64_t j = 0; j < QK; ++j) amax = std::max(amax, std::abs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    store_f16(out, d);
    for (int64_t j = 0; j < QK; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
  }
}

void dequantize_q4_0(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / QK; ++b, in += 18, y += QK) {
    const float d = load_f16(in);
    for (int64_t j = 0; j < QK / 2; ++j) {
      y[j] = static_cast<float>((in[2 + j] & 0x0F) - 8) * d;
      y[j + QK / 2] = static_cast<float>((in[2 + j] >> 4) - 8) * d;
    }
  }
}
// Q4_0: d = (the value of largest magnitude) / -8, codes (x / d + 8) truncated after +0.5.
void quantize_q4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / QK; ++b, x += QK, out += 18) {
    float amax = 0, mx = 0;
    for (int64_t j = 0; j < QK; ++j)
      if (std::abs(x[j]) > amax) amax = std::abs(x[j]), mx = x[j];
    const float d = mx / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    store_f16(out, d);
    auto code = [&](float v) { return static_cast<uint8_t>(std::min(15, static_cast<int>(v * id + 8.5f))); };
    for (int64_t j = 0; j < QK / 2; ++j) out[2 + j] = static_cast<uint8_t>(code(x[j]) | (code(x[j + QK / 2]) << 4));
  }
}

void decode_q4_1(const uint8_t* in, int64_t n_blocks, float* y) {
  for (int64_t b = 0; b < n_blocks; ++b, in += 20, y += QK) {
    const float d = load_f16(in), m = load_f16(in + 2);
    for (int j = 0; j < QK / 2; ++j) {
      y[j] = d * static_cast<float>(in[4 + j] & 15) + m;
      y[j + QK / 2] = d * static_cast<float>(in[4 + j] >> 4) + m;
    }
  }
}
void decode_q5_0(const uint8_t* in, int64_t n_blocks, float* y) {
  for (int64_t b = 0; b < n_blocks; ++b, in += 22, y += QK) {
    const float d = load_f16(in);
    const uint32_t qh = load_u32(in + 2);
    for (int j = 0; j < QK / 2; ++j) {
      const int lo = (in[6 + j] & 15) | (((qh >> j) & 1) << 4);
      const int hi = (in[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(lo - 16);
      y[j + QK / 2] = d * static_cast<float>(hi - 16);
    }
  }
}
void decode_q5_1(const uint8_t* in, int64_t n_blocks, float* y) {
  for (int64_t b = 0; b < n_blocks; ++b, in += 24, y += QK) {
    const float d = load_f16(in), m = load_f16(in + 2);
    const uint32_t qh = load_u32(in + 4);
    for (int j = 0; j < QK / 2; ++j) {
      const int lo = (in[8 + j] & 15) | (((qh >> j) & 1) << 4);
      const int hi = (in[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(lo) + m;
      y[j + QK / 2] = d * static_cast<float>(hi) + m;
    }
  }
}

namespace {
// Packs 32 codes (0..31) as 16 nibble bytes + a u32 of their bit 4 (only used when `qh`).
void pack_32(const int q[QK], uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < QK / 2; ++j) qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + QK / 2] & 15) << 4));
  for (int j = 0; j < QK; ++j) h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  if (qh) std::memcpy(qh, &h, 4);
}
// Q4_1/Q5_1: an affine fit per block, d and m stored as f16; codes use the stored (rounded) d
// and m so that rounding them costs nothing extra.
void encode_affine_32(const float* x, int64_t n_blocks, uint8_t* out, int nmax, uint64_t block_bytes) {
  for (int64_t b = 0; b < n_blocks; ++b, x += QK, out += block_bytes) {
    const Affine a = fit_affine(x, QK, nmax, false);
    store_f16(out, a.scale);
    store_f16(out + 2, -a.offset);
    const float d = load_f16(out), m = load_f16(out + 2);
    int q[QK];
    for (int j = 0; j < QK; ++j) q[j] = d != 0 ? std::clamp(nearest((x[j] - m) / d), 0, nmax) : 0;
    if (nmax == 15) pack_32(q, out + 4, nullptr);
    else pack_32(q, out + 8, out + 4);
  }
}
}  // namespace

void encode_q4_1(const float* x, int64_t n_blocks, uint8_t* out) { encode_affine_32(x, n_blocks, out, 15, 20); }
void encode_q5_1(const float* x, int64_t n_blocks, uint8_t* out) { encode_affine_32(x, n_blocks, out, 31, 24); }
void encode_q5_0(const float* x, int64_t n_blocks, uint8_t* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += QK, out += 22) {
    store_f16(out, fit_symmetric(x, QK, 16));
    const float d = load_f16(out);
    int q[QK];
    for (int j = 0; j < QK; ++j) q[j] = d != 0 ? std::clamp(nearest(x[j] / d), -16, 15) + 16 : 16;
    pack_32(q, out + 6, out + 2);
  }
}

// ---- k-quants ------------------------------------------------------------------------------

// Q2_K: value i of the super-block sits in qs[(i / 128) * 32 + i % 32] at bit 2 * ((i / 32) % 4);
// its sub-block (scale byte) is i / 16.
void decode_q2_k(const uint8_t* in, int64_t n_blocks, float* y) {
  for (int64_t b = 0; b < n_blocks; ++b, in += 84, y += QKK) {
    const uint8_t *scales = in, *qs = in + 16;
    const float d = load_f16(in + 80), dmin = load_f16(in + 82);
    for (int i = 0; i < QKK; ++i) {
      const float dl = d * static_cast<float>(scales[i / 16] & 15), ml = dmin * static_cast<float>(scales[i / 16] >> 4);
      const int q = (qs[(i / 128) * 32 + i % 32] >> (2 * ((i / 32) % 4))) & 3;
      y[i] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q3_K: the low 2 bits as Q2_K; the third bit of value i is bit i / 32 of hmask[i % 32], and a
// clear bit subtracts 4. Scale k (of 16) is the low nibble (k < 8) or high nibble of scales[k % 8]
// plus, as bits 4-5, bits 2 * (k / 4) of scales[8 + k % 4]; stored biased by 32.
void decode_q3_k(const uint8_t* in, int64_t n_blocks, float* y) {
  for (int64_t b = 0; b < n_blocks; ++b, in += 110, y += QKK) {
    const uint8_t *hmask = in, *qs = in + 32, *s = in + 96;
    const float d = load_f16(in + 108);
    float dl[16];
    for (int k = 0; k < 16; ++k) {
      const int low = (s[k % 8] >> (4 * (k / 8))) & 15, high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
      dl[k] = d * static_cast<float>((low | (high << 4)) - 32);
    }
    for (int i = 0; i < QKK; ++i) {
      const int low = (qs[(i / 128) * 32 + i % 32] >> (2 * ((i / 32) % 4))) & 3;
      const int bit = (hmask[i % 32] >> (i / 32)) & 1;
      y[i] = dl[i / 16] * static_cast<float>(low - (bit ? 0 : 4));
    }
  }
}

// Q4_K: value i sits in qs[(i / 64) * 32 + i % 32], low nibble when (i / 32) is even; sub-block
// i / 32. Q5_K adds bit 4 of value i as bit i / 32 of qh[i % 32].
namespace {
void decode_k_4_5(const uint8_t* in, int64_t n_blocks, float* y, bool five) {
  const uint64_t bytes = five ? 176 : 144;
  for (int64_t b = 0; b < n_blocks; ++b, in += bytes, y += QKK) {
    const float d = load_f16(in), dmin = load_f16(in + 2);
    uint8_t sc[8], mn[8];
    unpack_k_scales(in + 4, sc, mn);
    const uint8_t* qh = in + 16;
    const uint8_t* qs = in + (five ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(sc[j]), ml = dmin * static_cast<float>(mn[j]);
      for (int l = 0; l < 32; ++l) {
        const int i = j * 32 + l;
        int q = (qs[(i / 64) * 32 + l] >> (4 * (j % 2))) & 15;
        if (five) q |= ((qh[l] >> j) & 1) << 4;
        y[i] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}
}  // namespace
void decode_q4_k(const uint8_t* in, int64_t n_blocks, float* y) { decode_k_4_5(in, n_blocks, y, false); }
void decode_q5_k(const uint8_t* in, int64_t n_blocks, float* y) { decode_k_4_5(in, n_blocks, y, true); }

// Q6_K: the low 4 bits of value i sit in ql[(i / 128) * 64 + i % 64], high nibble when
// (i / 64) is odd; the top 2 bits in qh[(i / 128) * 32 + i % 32] at bit 2 * ((i / 32) % 4).
// Sub-block (int8 scale) i / 16.
void decode_q6_k(const uint8_t* in, int64_t n_blocks, float* y) {
  for (int64_t b = 0; b < n_blocks; ++b, in += 210, y += QKK) {
    const uint8_t *ql = in, *qh = in + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(in + 192);
    const float d = load_f16(in + 208);
    for (int i = 0; i < QKK; ++i) {
      const int low = (ql[(i / 128) * 64 + i % 64] >> (4 * ((i / 64) % 2))) & 15;
      const int high = (qh[(i / 128) * 32 + i % 32] >> (2 * ((i / 32) % 4))) & 3;
      y[i] = (d * static_cast<float>(sc[i / 16])) * static_cast<float>((low | (high << 4)) - 32);
    }
  }
}

namespace {
// Q4_K/Q5_K encoder: an affine fit per 32-value sub-block (fit_affine, offset >= 0), then the 8
// scales and 8 offsets quantised to 6 bits against the super-block's f16 d and dmin (the largest
// of each / 63), then the codes recomputed from the scales as they will be decoded.
void encode_k_4_5(const float* x, int64_t n_blocks, uint8_t* out, bool five) {
  const int nmax = five ? 31 : 15;
  const uint64_t bytes = five ? 176 : 144;
  for (int64_t b = 0; b < n_blocks; ++b, x += QKK, out += bytes) {
    std::memset(out, 0, bytes);
    Affine a[8];
    float max_scale = 0, max_offset = 0;
    for (int j = 0; j < 8; ++j) {
      a[j] = fit_affine(x + 32 * j, 32, nmax, true);
      max_scale = std::max(max_scale, a[j].scale), max_offset = std::max(max_offset, a[j].offset);
    }
    store_f16(out, max_scale / 63);
    store_f16(out + 2, max_offset / 63);
    const float d = load_f16(out), dmin = load_f16(out + 2);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(d != 0 ? std::clamp(nearest(a[j].scale / d), 0, 63) : 0);
      // The offset rounds up so the sub-block's lowest value stays representable.
      mn[j] = static_cast<uint8_t>(dmin != 0 ? std::clamp(static_cast<int>(std::ceil(a[j].offset / dmin)), 0, 63) : 0);
    }
    pack_k_scales(sc, mn, out + 4);
    uint8_t* qh = out + 16;
    uint8_t* qs = out + (five ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(sc[j]), ml = dmin * static_cast<float>(mn[j]);
      for (int l = 0; l < 32; ++l) {
        const int i = j * 32 + l;
        const int q = dl != 0 ? std::clamp(nearest((x[i] + ml) / dl), 0, nmax) : 0;
        qs[(i / 64) * 32 + l] |= static_cast<uint8_t>((q & 15) << (4 * (j % 2)));
        if (five) qh[l] |= static_cast<uint8_t>(((q >> 4) & 1) << j);
      }
    }
  }
}
}  // namespace
void encode_q4_k(const float* x, int64_t n_blocks, uint8_t* out) { encode_k_4_5(x, n_blocks, out, false); }
void encode_q5_k(const float* x, int64_t n_blocks, uint8_t* out) { encode_k_4_5(x, n_blocks, out, true); }

// Q6_K encoder: a symmetric fit per 16-value sub-block (fit_symmetric, codes -32..31), the 16
// scales quantised to int8 against the super-block's f16 d (largest magnitude / 127), then the
// codes recomputed from the decoded scales.
void encode_q6_k(const float* x, int64_t n_blocks, uint8_t* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += QKK, out += 210) {
    std::memset(out, 0, 210);
    float scale[16], amax = 0;
    for (int k = 0; k < 16; ++k) {
      scale[k] = fit_symmetric(x + 16 * k, 16, 32);
      amax = std::max(amax, std::abs(scale[k]));
    }
    store_f16(out + 208, amax / 127);
    const float d = load_f16(out + 208);
    auto* sc = reinterpret_cast<int8_t*>(out + 192);
    for (int k = 0; k < 16; ++k) sc[k] = static_cast<int8_t>(d != 0 ? std::clamp(nearest(scale[k] / d), -128, 127) : 0);
    uint8_t *ql = out, *qh = out + 128;
    for (int i = 0; i < QKK; ++i) {
      const float dl = d * static_cast<float>(sc[i / 16]);
      const int q = (dl != 0 ? std::clamp(nearest(x[i] / dl), -32, 31) : 0) + 32;
      ql[(i / 128) * 64 + i % 64] |= static_cast<uint8_t>((q & 15) << (4 * ((i / 64) % 2)));
      qh[(i / 128) * 32 + i % 32] |= static_cast<uint8_t>((q >> 4) << (2 * ((i / 32) % 4)));
    }
  }
}

// ---- the table -----------------------------------------------------------------------------

namespace {
void decode_q8_0_blocks(const uint8_t* in, int64_t n, float* y) { dequantize_q8_0(in, n * QK, y); }
void decode_q4_0_blocks(const uint8_t* in, int64_t n, float* y) { dequantize_q4_0(in, n * QK, y); }
void encode_q8_0_blocks(const float* x, int64_t n, uint8_t* out) { quantize_q8_0(x, n * QK, out); }
void encode_q4_0_blocks(const float* x, int64_t n, uint8_t* out) { quantize_q4_0(x, n * QK, out); }

constexpr GGMLTypeInfo kTypes[] = {
    {GGMLType::F32, "F32", 1, 4, nullptr, nullptr},
    {GGMLType::F16, "F16", 1, 2, nullptr, nullptr},
    {GGMLType::Q4_0, "Q4_0", QK, 18, decode_q4_0_blocks, encode_q4_0_blocks},
    {GGMLType::Q4_1, "Q4_1", QK, 20, decode_q4_1, encode_q4_1},
    {GGMLType::Q5_0, "Q5_0", QK, 22, decode_q5_0, encode_q5_0},
    {GGMLType::Q5_1, "Q5_1", QK, 24, decode_q5_1, encode_q5_1},
    {GGMLType::Q8_0, "Q8_0", QK, 34, decode_q8_0_blocks, encode_q8_0_blocks},
    {GGMLType::Q2_K, "Q2_K", QKK, 84, decode_q2_k, nullptr},
    {GGMLType::Q3_K, "Q3_K", QKK, 110, decode_q3_k, nullptr},
    {GGMLType::Q4_K, "Q4_K", QKK, 144, decode_q4_k, encode_q4_k},
    {GGMLType::Q5_K, "Q5_K", QKK, 176, decode_q5_k, encode_q5_k},
    {GGMLType::Q6_K, "Q6_K", QKK, 210, decode_q6_k, encode_q6_k},
    {GGMLType::BF16, "BF16", 1, 2, nullptr, nullptr},
};
}  // namespace

const GGMLTypeInfo* ggml_type_info(uint32_t type) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == type) return &t;
  return nullptr;
}
const GGMLTypeInfo& ggml_type_info(GGMLType type) { return *ggml_type_info(static_cast<uint32_t>(type)); }

const char* ggml_supported_types() {
  return "F32=0, F16=1, Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q2_K=10, Q3_K=11, Q4_K=12, Q5_K=13, Q6_K=14, "
         "BF16=30";
}

}  // namespace corelm::io
