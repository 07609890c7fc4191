// AVX2 + FMA + F16C build of the attention over an encoded KV cache (kv_attention_tiles.h): the
// 8-lane traits. The turbo4 codebook (16 levels) is two ymm of 8; a lookup permutes both with
// the code's low 3 bits and picks one by bit 3 (shifted into the sign bit for vblendvps).
#include <cstring>

#include "kernels/cpu/avx2/gemm_vec.h"
#include "kernels/cpu/avx2/vec_math.h"
#include "kernels/cpu/kv_attention_tiles.h"

namespace corelm::kernels::avx2 {
namespace {

struct KvYmm : Ymm {
  struct Codebook {
    __m256 lo, hi;  // levels 0..7 and 8..15 (hi unused for 8 levels)
  };
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
  static __m128i load8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
  static Reg f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Reg bf16(const uint8_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static Reg i8(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p))); }
  static Reg q4_lo(const uint8_t* p) {
    const __m256i b = _mm256_and_si256(_mm256_cvtepu8_epi32(load8(p)), _mm256_set1_epi32(0x0f));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(8)));
  }
  static Reg q4_hi(const uint8_t* p) {
    const __m256i b = _mm256_srli_epi32(_mm256_cvtepu8_epi32(load8(p)), 4);
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(8)));
  }
  static Codebook codebook(const float* levels, int count) {
    if (count == 0) return {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256 lo = _mm256_loadu_ps(levels);
    return {lo, count > 8 ? _mm256_loadu_ps(levels + 8) : lo};
  }
  // Codes i = 0..7 at bits 4i of the 4 bytes at p (two per byte, even index low).
  static Reg t4(const uint8_t* p, const Codebook& cb) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    const __m256i idx = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(0x0f));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(cb.lo, idx), _mm256_permutevar8x32_ps(cb.hi, idx),
                            _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
  }
  // Codes i = 0..7 at bits 3i of the 3-byte group at g (read as the top 3 bytes of g[-1..2]).
  static Reg t3(const uint8_t* g, const Codebook& cb) {
    uint32_t w;
    std::memcpy(&w, g - 1, 4);
    const __m256i idx = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w >> 8)), _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)),
        _mm256_set1_epi32(7));
    return _mm256_permutevar8x32_ps(cb.lo, idx);
  }
  static Reg transpose_sum(const Reg part[8]) { return transpose_sum8(part); }
  static float reduce_max(Reg v) { return avx2::reduce_max(v); }
  static float reduce_add(Reg v) { return avx2::reduce_add(v); }
  static Reg exp(Reg v) { return exp_ps(v); }
  static Reg below(Reg v, int n, float fill) {
    return _mm256_blendv_ps(_mm256_set1_ps(fill), v, _mm256_castsi256_ps(first(n)));
  }
  static Reg nan_from(Reg p, Reg s) { return _mm256_blendv_ps(p, s, _mm256_cmp_ps(s, s, _CMP_UNORD_Q)); }
};

}  // namespace

bool quant_attention_heads(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                           int64_t kv_head, int64_t heads, int64_t pos, const CachedAttention& shape,
                           QuantCacheFormats formats) {
  return attend_quantized<KvYmm>(q, k_cache, v_cache, out, kv_head, heads, pos, shape, formats);
}

}  // namespace corelm::kernels::avx2
