// The recurrent (decode) form of ops::linear_attention for the model's stateful decoding: one new
// token of one sequence updates that sequence's state in place. Private to the library (src/), at
// the ops level so the model reaches it without including kernels/. No autograd.
//   state_g = diag(decay_g) state_g + k_g v_gᵀ,   out_h = scale · state_gᵀ q_h   (g = h / (Hq / Hkv))
// Stepping token by token gives ops::linear_attention's output and final_state (tested to f32
// rounding); a document boundary is the caller's to handle (zero the state before the token).
#pragma once
#include <cstdint>
#include <optional>

#include "corelm/tensor.h"

namespace corelm::ops {

struct LinearAttentionStepShape {
  int64_t q_heads = 0;    // Hq
  int64_t kv_heads = 0;   // Hkv, divides Hq
  int64_t state_dim = 0;  // d_s
  int64_t value_dim = 0;  // d_v
};

// decay = exp(log_decay), [Hkv, d_s] f32: computed once (when the weights are packed), bit for bit
// the factor the chunked kernel uses. ValueError if log_decay has an entry > 0 or not finite.
Tensor linear_attention_decay(const Tensor& log_decay);

// The hot-path form on raw contiguous f32 buffers: state [Hkv, d_s, d_v] (updated in place),
// q [Hq, d_s], k [Hkv, d_s], v [Hkv, d_v], decay [Hkv, d_s], out [Hq, d_v]. No allocation, no
// checks beyond what the caller already guarantees, one thread.
void linear_attention_step(float* state, const float* q, const float* k, const float* v, const float* decay,
                           float* out, const LinearAttentionStepShape& shape, float scale = 1.0f);

// Where one sequence's run of tokens sits: token t's q heads at q + t · ld (head h at + h · d_s),
// its k heads at k + t · ld, its v heads at v + t · ld (head g at + g · d_v); out for token t at
// out + t · ldo (head h at + h · d_v). The fused qkv rows of the inference forward.
struct LinearAttentionRun {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ld = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int64_t tokens = 0;
};

// The prefill form: a run of tokens of one sequence through the chunked parallel form that
// ops::linear_attention uses for training (kernels::fast::linear_attention_forward's chunk loop,
// chunks of kLinearAttentionPrefillChunk), starting from `state` [Hkv, d_s, d_v] and leaving the
// state after the last token there. state_zero: the state holds zeros (the sequence starts here).
// log_decay [Hkv, d_s], host. Equal to stepping linear_attention_step token by token up to f32
// rounding (the sums are grouped differently: a chunk's pairs through matmuls, the carried state
// once per chunk). Buffers are this thread's, reused: no allocation once they have grown to the
// largest segment. The tokens run in segments of kLinearAttentionPrefillSegment (a multiple of the
// chunk, so the chunks and the result are those of one call) to bound the repacking buffers.
// One thread; the caller runs sequences in parallel.
inline constexpr int64_t kLinearAttentionPrefillChunk = 64;
inline constexpr int64_t kLinearAttentionPrefillSegment = 4 * kLinearAttentionPrefillChunk;
void linear_attention_prefill(float* state, bool state_zero, const LinearAttentionRun& run, const float* log_decay,
                              const LinearAttentionStepShape& shape, float scale = 1.0f);

// The checked form: the same on tensors (shapes and dtypes as above, state contiguous f32; a
// mistake is a ShapeError/DTypeError naming the shapes). Returns out [Hq, d_v].
Tensor linear_attention_step(Tensor& state, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                             std::optional<float> scale = std::nullopt);

namespace detail {
// ValueError naming the first entry of log_decay that is > 0 or not finite.
void check_log_decay(const char* op, const Tensor& log_decay);
}  // namespace detail

}  // namespace corelm::ops
