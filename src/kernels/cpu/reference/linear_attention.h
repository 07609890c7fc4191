// Reference kernels for log-decay linear attention (contract: ops::linear_attention in
// include/corelm/ops.h; formula and sources in docs/KERNELS.md, "Log-decay linear attention").
// Per batch row b and kv head g a state S [d_s, d_v] follows
//   S_t = diag(exp(a_g)) S_{t-1} + k_t v_tᵀ      (S_{-1} = initial state or zeros; reset to zero
//                                                 before t when reset[b, t] is set)
//   o_t = scale · S_tᵀ q_t                         (for every query head h of kv head g)
// These kernels are the literal per-token recurrence in double precision: the yardstick the
// chunked kernel (kernels/cpu/linear_attention_fast.h) is tested against.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

struct LinearAttentionDims {
  int64_t batch = 0;
  int64_t q_heads = 0;    // Hq
  int64_t kv_heads = 0;   // Hkv, divides Hq; query head h reads kv head h / (Hq / Hkv)
  int64_t seq_len = 0;    // T
  int64_t state_dim = 0;  // d_s (query/key width)
  int64_t value_dim = 0;  // d_v
};

// q [B, Hq, T, d_s], k [B, Hkv, T, d_s], v [B, Hkv, T, d_v], log_decay [Hkv, d_s] (<= 0),
// reset [B, T] (1: the state is zeroed before position t; null: never), initial_state
// [B, Hkv, d_s, d_v] (null: zeros), out [B, Hq, T, d_v], final_state [B, Hkv, d_s, d_v] (null: not
// wanted) receives S_{T-1}. All contiguous f32. Work is split by (batch, kv head).
void linear_attention_forward(const float* q, const float* k, const float* v, const float* log_decay,
                              const uint8_t* reset, const float* initial_state, float* out, float* final_state,
                              const LinearAttentionDims& dims, float scale);

// Gradients for q, k, v and log_decay given grad_out [B, Hq, T, d_v]. Recomputes and keeps every
// state S_t of one (batch, kv head) (T · d_s · d_v doubles), then runs the recurrence backwards in
// time: dS_t = scale Σ_h q_t dO_tᵀ + diag(exp(a)) dS_{t+1} (no carry across a reset). grad_log_decay
// [Hkv, d_s] sums the batch rows in row order after each (batch, kv head) is done.
void linear_attention_backward(const float* q, const float* k, const float* v, const float* log_decay,
                               const uint8_t* reset, const float* initial_state, const float* grad_out,
                               float* grad_q, float* grad_k, float* grad_v, float* grad_log_decay,
                               const LinearAttentionDims& dims, float scale);

}  // namespace corelm::kernels::reference
