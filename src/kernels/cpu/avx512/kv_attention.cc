// The attention over an encoded KV cache with the AVX-512 flags: the 16-lane traits of the
// hand-vectorised kernel (kv_attention_tiles.h; a codebook lookup is one vpermps over the 16
// levels), and the portable kernel compiled with the same flags (kv_attention_impl.h) for the
// head sizes the fast one does not take.
#include <cstring>

#include "kernels/cpu/avx512/gemm_vec.h"
#include "kernels/cpu/avx512/vec_math.h"
#include "kernels/cpu/kv_attention_tiles.h"

#define CORELM_KV_ATTENTION_NAME quant_attention_head_avx512
#include "kernels/cpu/kv_attention_impl.h"

namespace corelm::kernels::avx512 {
namespace {

struct KvZmm : Zmm {
  struct Codebook {
    __m512 levels;  // 16 levels (8 levels in lanes 0..7 for turbo3)
  };
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
  static __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static Reg f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg bf16(const uint8_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static Reg i8(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(p))); }
  static Reg q4_lo(const uint8_t* p) {
    const __m512i b = _mm512_and_si512(_mm512_cvtepu8_epi32(load16(p)), _mm512_set1_epi32(0x0f));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(b, _mm512_set1_epi32(8)));
  }
  static Reg q4_hi(const uint8_t* p) {
    const __m512i b = _mm512_srli_epi32(_mm512_cvtepu8_epi32(load16(p)), 4);
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(b, _mm512_set1_epi32(8)));
  }
  static Codebook codebook(const float* levels, int count) {
    if (count == 0) return {_mm512_setzero_ps()};
    return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1u), levels)};
  }
  // Two 32-bit words as lanes 0..7 and 8..15, each shifted right by the lane's multiple of `step`.
  static __m512i spread(uint32_t w0, uint32_t w1, int step) {
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(w0))),
                                            _mm256_set1_epi32(static_cast<int>(w1)), 1);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    return _mm512_srlv_epi32(both, _mm512_mullo_epi32(lane, _mm512_set1_epi32(step)));
  }
  // Codes i = 0..15 at bits 4i of the 8 bytes at p (two per byte, even index low).
  static Reg t4(const uint8_t* p, const Codebook& cb) {
    uint32_t w[2];
    std::memcpy(w, p, 8);
    return _mm512_permutexvar_ps(_mm512_and_si512(spread(w[0], w[1], 4), _mm512_set1_epi32(0x0f)), cb.levels);
  }
  // Codes of two 3-byte groups at g (each read as the top 3 bytes of the 4 from one byte before).
  static Reg t3(const uint8_t* g, const Codebook& cb) {
    uint32_t w0, w1;
    std::memcpy(&w0, g - 1, 4);
    std::memcpy(&w1, g + 2, 4);
    return _mm512_permutexvar_ps(_mm512_and_si512(spread(w0 >> 8, w1 >> 8, 3), _mm512_set1_epi32(7)), cb.levels);
  }
  static Reg transpose_sum(const Reg part[16]) { return transpose_sum16(part); }
  static float reduce_max(Reg v) { return _mm512_reduce_max_ps(v); }
  static float reduce_add(Reg v) { return _mm512_reduce_add_ps(v); }
  static Reg exp(Reg v) { return exp_ps(v); }
  static Reg below(Reg v, int n, float fill) { return _mm512_mask_blend_ps(first(n), _mm512_set1_ps(fill), v); }
  static Reg nan_from(Reg p, Reg s) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q), p, s); }
};

}  // namespace

bool quant_attention_heads(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, float* out,
                           int64_t kv_head, int64_t heads, int64_t pos, const CachedAttention& shape,
                           QuantCacheFormats formats) {
  return attend_quantized<KvZmm>(q, k_cache, v_cache, out, kv_head, heads, pos, shape, formats);
}

}  // namespace corelm::kernels::avx512
