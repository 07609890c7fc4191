// Chunked parallel form of log-decay linear attention (same contract as
// reference/linear_attention.h; formula, sources and derivation in docs/KERNELS.md). Per (batch
// row, kv head) the sequence is cut into chunks of `chunk` positions (the last one shorter); with
// S_prev the state before the chunk that starts at t0, λ = exp(a) and w_d = exp(d·a) ≤ 1:
//   o_t = scale · [ Σ_c q_t[c] w_{t-t0+1}[c] S_prev[c, :]  +  Σ_{s=t0..t} A[t, s] v_s ],
//   A[t, s] = Σ_c q_t[c] k_s[c] w_{t-s}[c],
//   S_end = w_L ⊙ S_prev + Σ_s (k_s ⊙ w_{end-s}) v_sᵀ.
// Every exponent is ≤ 0, so nothing overflows, whatever the decay. A document reset inside a chunk
// masks the pairs (t, s) of different documents, the carried state for positions after the reset
// and the keys before it in S_end. A is built per sub-block of kLinearAttentionSubBlock query rows:
// the keys before the sub-block's first row p through one GEMM with the decay split at p,
// w_{t-s} = w_{t-p} · w_{p-s} (again both exponents ≤ 0), the pairs inside it as three-way dot
// products. The products with v, S and the split factors are kernels::gemm_f32 calls; the per-pair
// channel loops and the decode step are built for AVX2 + FMA and used on every fast path
// (linear_attention_loops.h), their baseline build when called under Isa::Reference.
// Work is split by (batch, kv head), each done by one task in a fixed order: a row's result does
// not depend on the other rows or on the thread count.
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/cpu/reference/linear_attention.h"

namespace corelm::kernels::fast {

using reference::LinearAttentionDims;

inline constexpr int64_t kLinearAttentionChunk = 64;
inline constexpr int64_t kLinearAttentionSubBlock = 16;

// Chunks of one row: ceil(T / chunk).
inline int64_t linear_attention_chunks(int64_t seq_len, int64_t chunk) { return (seq_len + chunk - 1) / chunk; }

// Layouts as in reference::linear_attention_forward. When chunk_states is not null it receives the
// state before every chunk, [B, Hkv, chunks, d_s, d_v] (chunk 0: the initial state or zeros), which
// the backward needs.
void linear_attention_forward(const float* q, const float* k, const float* v, const float* log_decay,
                              const uint8_t* reset, const float* initial_state, float* out, float* final_state,
                              float* chunk_states, const LinearAttentionDims& dims, float scale,
                              int64_t chunk = kLinearAttentionChunk);

// Reusable buffers of linear_attention_forward_group, one per thread: after the first call of a
// given size, later calls of at most that size allocate nothing (the inference prefill).
class LinearAttentionWorkspace {
 public:
  LinearAttentionWorkspace();
  ~LinearAttentionWorkspace();
  LinearAttentionWorkspace(const LinearAttentionWorkspace&) = delete;
  LinearAttentionWorkspace& operator=(const LinearAttentionWorkspace&) = delete;
  struct Scratch;

 private:
  std::unique_ptr<Scratch> scratch_;
  friend void linear_attention_forward_group(const float*, int64_t, const float*, const float*, const float*, float*,
                                             bool, float*, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                                             LinearAttentionWorkspace&, int64_t);
};

// One sequence and one kv head of linear_attention_forward (no document resets): the group of
// query heads sharing that kv head, q [group, T, d_s] (head h at q + h · q_head_stride), k [T, d_s],
// v [T, d_v], out [group, T, d_v] (head h at out + h · out_head_stride). state [d_s, d_v] is the
// state before the first position and becomes the state after the last, in place; state_zero says
// it holds zeros (the first chunk then skips the carried-state product, as the batched form does
// without an initial state). log_decay [d_s] of this kv head. The same chunk loop, in the same
// order, as linear_attention_forward, so a sequence's output is the same bits either way.
void linear_attention_forward_group(const float* q, int64_t q_head_stride, const float* k, const float* v,
                                    const float* log_decay, float* state, bool state_zero, float* out,
                                    int64_t out_head_stride, int64_t seq_len, int64_t group, int64_t state_dim,
                                    int64_t value_dim, float scale, LinearAttentionWorkspace& ws,
                                    int64_t chunk = kLinearAttentionChunk);

// Gradients of q, k, v and log_decay, chunk by chunk from the last, carrying dL/dS_end backwards;
// chunk_states as written by the forward with the same chunk. grad_log_decay [Hkv, d_s] sums the
// batch rows in row order.
void linear_attention_backward(const float* q, const float* k, const float* v, const float* log_decay,
                               const uint8_t* reset, const float* chunk_states, const float* grad_out,
                               float* grad_q, float* grad_k, float* grad_v, float* grad_log_decay,
                               const LinearAttentionDims& dims, float scale, int64_t chunk = kLinearAttentionChunk);

// One decode step of one sequence: state [Hkv, d_s, d_v] becomes diag(decay) state + k vᵀ in place
// and out [Hq, d_v] = scale · stateᵀ q. q [Hq, d_s], k [Hkv, d_s], v [Hkv, d_v], decay [Hkv, d_s]
// = exp(log_decay) (computed once by the caller). No allocation; single-threaded (a decode step
// is 2 · Hkv · d_s · d_v multiply-adds per query head group).
void linear_attention_step(float* state, const float* q, const float* k, const float* v, const float* decay,
                           float* out, int64_t q_heads, int64_t kv_heads, int64_t state_dim, int64_t value_dim,
                           float scale);

}  // namespace corelm::kernels::fast
