// Picks the fused kernel for active_isa(): AVX-512 from Isa::Avx512 up, AVX2 at Isa::Avx2, else
// the reference.
#include <cmath>

#include "corelm/error.h"
#include "corelm/isa.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/avx2/fused.h"
#include "kernels/cpu/avx512/fused.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/reference/fused.h"

namespace corelm::kernels {
namespace {
bool use_avx512() { return active_isa() >= Isa::Avx512; }
bool use_avx2() { return active_isa() == Isa::Avx2; }
}  // namespace

RopeTable::RopeTable(int64_t d, int64_t max_positions_, float theta)
    : head_dim(d), max_positions(max_positions_) {
  CORELM_CHECK(d > 0 && d % 2 == 0, ValueError, "RopeTable: head_dim must be even and positive, got ", d);
  const int64_t half = d / 2;
  cos.resize(static_cast<size_t>(max_positions * half));
  sin.resize(cos.size());
  // Same f32 steps as the reference rope kernel, so the tables agree with it bit for bit.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      cos[p * half + i] = std::cos(angle);
      sin[p * half + i] = std::sin(angle);
    }
}

void fused_rms_norm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int64_t rows,
                    int64_t d, float eps) {
  if (use_avx512()) return avx512::fused_rms_norm(x, ldx, weight, y, ldy, rows, d, eps);
  if (use_avx2()) return avx2::fused_rms_norm(x, ldx, weight, y, ldy, rows, d, eps);
  reference::fused_rms_norm(x, ldx, weight, y, ldy, rows, d, eps);
}

void fused_rope_inplace(float* x, int64_t heads, const RopeTable& table, int64_t pos) {
  CORELM_CHECK(pos >= 0 && pos < table.max_positions, ValueError, "rope: position ", pos, " outside the table of ",
               table.max_positions, " positions");
  if (use_avx512()) return avx512::fused_rope_inplace(x, heads, table, pos);
  if (use_avx2()) return avx2::fused_rope_inplace(x, heads, table, pos);
  reference::fused_rope_inplace(x, heads, table, pos);
}

void fused_swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n) {
  if (use_avx512()) return avx512::fused_swiglu(gu, ldgu, y, ldy, rows, n);
  if (use_avx2()) return avx2::fused_swiglu(gu, ldgu, y, ldy, rows, n);
  reference::fused_swiglu(gu, ldgu, y, ldy, rows, n);
}

void fused_attention_head(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape) {
  if (use_avx512() && avx512::fused_attention_head(q, k_cache, v_cache, out, head, pos, shape)) return;
  if (use_avx2() && avx2::fused_attention_head(q, k_cache, v_cache, out, head, pos, shape)) return;
  reference::fused_attention_head(q, k_cache, v_cache, out, head, pos, shape);
}

void fused_attention(const float* q, int64_t ldq, const float* k_cache, const float* v_cache, float* out,
                     int64_t ldo, int64_t T, int64_t start, const CachedAttention& shape) {
  CORELM_CHECK(shape.q_heads > 0 && shape.kv_heads > 0 && shape.q_heads % shape.kv_heads == 0, ValueError,
               "attention: q_heads ", shape.q_heads, " must be a positive multiple of kv_heads ", shape.kv_heads);
  CORELM_CHECK(start >= 0 && start + T <= shape.capacity, ValueError, "attention: positions [", start, ", ",
               start + T, ") exceed the cache capacity ", shape.capacity);
  const int64_t D = shape.head_dim, Hq = shape.q_heads;
  // Each (query, head) item writes only its own output, so any split over threads gives the same bits.
  parallel_for(T * Hq, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / Hq, h = item % Hq;
      fused_attention_head(q + t * ldq + h * D, k_cache, v_cache, out + t * ldo + h * D, h, start + t, shape);
    }
  });
}

}  // namespace corelm::kernels
