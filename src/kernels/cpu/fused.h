// Fused inference kernels (RMSNorm, RoPE in place, SwiGLU, attention against a KV cache) on raw
// fp32 buffers. Each entry point picks the kernel for active_isa(): the scalar reference in
// reference/fused.h is the contract, the AVX2 and AVX-512 kernels must agree with it within float
// rounding. Every kernel works row by row with a fixed reduction order, so a row's result never
// depends on the other rows, on how many rows there are, or on the thread count.
#pragma once
#include <cstdint>
#include <vector>

namespace corelm::kernels {

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight, rows of length d (row strides ldx/ldy).
void fused_rms_norm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int64_t rows,
                    int64_t d, float eps);

// cos/sin of the HF rotate-half rotation for positions [0, max_positions): entry (p, i) is
// cos/sin(f32(p) * inv_freq_i) with inv_freq_i = 1 / theta^(2i/d), all in f32 as HF computes it.
struct RopeTable {
  int64_t head_dim = 0, max_positions = 0;
  std::vector<float> cos, sin;  // [max_positions, head_dim / 2]
  RopeTable() = default;
  RopeTable(int64_t head_dim, int64_t max_positions, float theta);
  const float* cos_at(int64_t pos) const { return cos.data() + pos * (head_dim / 2); }
  const float* sin_at(int64_t pos) const { return sin.data() + pos * (head_dim / 2); }
};

// Rotates `heads` consecutive head vectors of one token (x: heads * d floats) in place at
// position `pos`: x[i] = x[i] c - x[i+h] s, x[i+h] = x[i+h] c + x[i] s, h = d / 2.
void fused_rope_inplace(float* x, int64_t heads, const RopeTable& table, int64_t pos);

// y[r, j] = silu(gu[r, j]) * gu[r, n + j]: the gate and up halves of one fused [rows, 2n] linear
// output (row stride ldgu); y has row stride ldy.
void fused_swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n);

// One sequence's causal attention against its KV cache. The cache holds [kv_heads, capacity,
// head_dim] fp32 keys and values; positions [0, start + T) are filled. Query t (row t of q,
// q_heads * head_dim floats, row stride ldq) sits at position start + t and attends keys
// 0 ..= start + t; query head h reads kv head h / (q_heads / kv_heads). out has row stride ldo.
struct CachedAttention {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
};
void fused_attention(const float* q, int64_t ldq, const float* k_cache, const float* v_cache, float* out,
                     int64_t ldo, int64_t T, int64_t start, const CachedAttention& shape);

// The same, for one (query row, query head) pair: the unit of work the caller spreads over
// threads. q and out point at that head's head_dim floats; pos is the query's position.
void fused_attention_head(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape);

}  // namespace corelm::kernels
