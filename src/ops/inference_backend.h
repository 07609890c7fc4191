// The inference-backend seam: what the model's inference forward asks of a device, in raw fp32
// buffers and opaque packed-weight handles (no model types, no kernels/ types), so the model
// component never includes kernels/. Each block kind (src/model/blocks/) packs its weights once
// through a backend and runs its inference forward as a few calls per layer: the virtual calls
// are per layer op, never per element or per token, so the seam costs nothing measurable.
//
// The only implementation today is the CPU fast path (cpu_backend(), src/ops/cpu_backend*.cc: the
// fused kernels of kernels/cpu/ and the packed bf16 / int8 / q4 linears). A device backend (CUDA,
// HIP) implements the same class over device buffers: every float* handed to it is a buffer from
// its own scratch() or a packed handle of its own, except where a comment says "host".
//
// Contract shared by every method: each row (token) is computed independently of the other rows
// and of the thread count, with reductions in a fixed order (batch and thread invariance).
// Private to the library (model and ops); not a public header.
#pragma once
#include <cstdint>
#include <memory>

#include "ops/kv_codec.h"

namespace corelm::ops {

// How a linear's weights are packed.
//   BF16: weights rounded to bf16, activations rounded to bf16 inside the matmul, fp32 accumulation.
//   Int8: per-output-row weight scales, per-row dynamic activation scales, int32 accumulation.
//   Q4:   blocks of 32 weights with an fp16 scale and minimum (the backend's preferred q4 format).
enum class WeightFormat { BF16, Int8, Q4 };

// Opaque packed weights, created by one backend and only ever passed back to it.
class PackedLinear {  // a linear layer W [n, k] (+ bias [n])
 public:
  virtual ~PackedLinear() = default;
  virtual int64_t n() const = 0;  // out_features
  virtual int64_t k() const = 0;  // in_features
};
class PackedVector {  // an fp32 vector kept as is (norm weights)
 public:
  virtual ~PackedVector() = default;
  virtual int64_t size() const = 0;
};
class PackedHead {  // an LM head [V, k] (no bias), packed in blocks of output rows
 public:
  virtual ~PackedHead() = default;
  virtual int64_t vocab() const = 0;
};

// cos/sin of the HF rotate-half RoPE for positions [0, n); entries do not depend on n.
class RopeTable {
 public:
  virtual ~RopeTable() = default;
  virtual int64_t positions() const = 0;
};
// A growing RoPE table for one (head_dim, theta), safe to share between threads: at_least(n)
// returns a table covering positions [0, n) that the caller keeps for its forward (a later call
// may replace the shared one; the returned table stays valid while held).
class RopeTables {
 public:
  virtual ~RopeTables() = default;
  virtual std::shared_ptr<const RopeTable> at_least(int64_t positions) const = 0;
};

// One layer of a per-row KV cache: keys and values each [rows, kv_heads, capacity, row bytes],
// a head vector of head_dim values stored in `k_format` / `v_format` (ops/kv_codec.h; F32 rows are
// plain floats).
struct KVLayerView {
  void* k = nullptr;
  void* v = nullptr;
  KVFormat k_format = KVFormat::F32, v_format = KVFormat::F32;
  int64_t k_row_bytes = 0, v_row_bytes = 0;
  int64_t capacity = 0;
};

// One sliding-window layer's rings: keys and values each f32 [rows, kv_heads, ring, head_dim],
// position p of a row in slot p % ring (ops/sliding_attention_ring.h); a query sees itself and the
// `window` positions before it.
struct RingLayerView {
  float* k = nullptr;
  float* v = nullptr;
  int64_t ring = 0, window = 0;
};

// One linear-attention layer's recurrent states: f32 [rows, kv_heads, state_dim, head_dim].
struct StateLayerView {
  float* state = nullptr;
  int64_t state_dim = 0;
};

// Heads of a GQA attention: query head h reads kv head h / (q_heads / kv_heads).
struct AttentionShape {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
};

// Where the tokens of one call sit: `rows` batch rows of `per_row` consecutive tokens each (token
// i is row i / per_row); row b's first token is at position start[b] + offset and goes to cache
// row cache_row[b]. offset > 0 describes the last per_row tokens of rows that were longer (the
// last layer keeping only each row's final token).
struct TokenLayout {
  int64_t rows = 0, per_row = 0, offset = 0;
  const int64_t* start = nullptr;
  const int64_t* cache_row = nullptr;
  int64_t tokens() const { return rows * per_row; }
  int64_t row_of(int64_t i) const { return i / per_row; }
  int64_t position(int64_t i) const { return start[i / per_row] + offset + i % per_row; }
};

// Reusable per-thread buffers of the inference forward, one per slot; they only grow, so a
// steady-state decode allocates nothing. A new block kind that needs its own buffer adds a slot.
enum class Scratch { X, Hidden, QKV, Attn, GateUp, Mid, Tmp, HeadLogits, HeadBest, Count };

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;
  virtual const char* name() const = 0;

  // ---- packing (once, at prepare time); host inputs
  // W [n, k] row-major (row stride k), bias n floats or null.
  virtual std::unique_ptr<PackedLinear> pack_linear(const float* W, int64_t n, int64_t k, const float* bias,
                                                    WeightFormat format) const = 0;
  virtual std::unique_ptr<PackedVector> pack_vector(const float* x, int64_t n) const = 0;
  // W [V, k] row-major. lm_head and lm_head_argmax run the same blocks, so the fused argmax sees
  // bitwise the logits lm_head returns.
  virtual std::unique_ptr<PackedHead> pack_head(const float* W, int64_t V, int64_t k, WeightFormat format) const = 0;
  virtual std::unique_ptr<RopeTables> make_rope_tables(int64_t head_dim, float theta) const = 0;

  // ---- buffers
  // This thread's buffer for `slot`, at least n floats (contents kept from the last use).
  virtual float* scratch(Scratch slot, int64_t n) const = 0;
  // dst[i] = src[i], i < n (dst may be host memory: a result leaving the backend).
  virtual void copy(float* dst, const float* src, int64_t n) const = 0;
  // x[i, :] = table[ids[i], :] for i < n; table [*, width] is the host embedding, ids host and
  // already checked against the table.
  virtual void gather_rows(const float* table, int64_t width, const int64_t* ids, int64_t n, float* x) const = 0;

  // ---- layer ops
  // Y[m, n] = X[m, k] W^T (+ bias); row strides ldx >= k, ldy >= n.
  virtual void linear(const PackedLinear& W, const float* X, int64_t m, int64_t ldx, float* Y, int64_t ldy) const = 0;
  // y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight, rows of weight.size() values.
  virtual void rms_norm(const float* x, int64_t ldx, const PackedVector& weight, float* y, int64_t ldy, int64_t rows,
                        float eps) const = 0;
  // x[i] += y[i], i < n.
  virtual void add_inplace(float* x, const float* y, int64_t n) const = 0;
  // y[r, j] = silu(gu[r, j]) * gu[r, n + j]: the gate and up halves of one fused [rows, 2n] output.
  virtual void swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n) const = 0;

  // For each token i of `layout`: the row qkv + i * ldqkv holds q (q_heads heads), then k and v
  // (kv_heads heads each). Rotates q and k in place at the token's position and writes k and v
  // into the token's cache row at that position.
  virtual void rope_and_cache_write(float* qkv, int64_t ldqkv, const TokenLayout& layout, const RopeTable& rope,
                                    const AttentionShape& shape, const KVLayerView& cache) const = 0;
  // Causal attention of each token's queries (q + i * ldq, q_heads heads) against its cache row,
  // positions 0 ..= the token's position (already written); out + i * ldo gets q_heads * head_dim.
  virtual void cached_attention(const float* q, int64_t ldq, float* out, int64_t ldo, const TokenLayout& layout,
                                const AttentionShape& shape, const KVLayerView& cache) const = 0;

  // Sliding-window attention over rings. rope_and_ring_write: as rope_and_cache_write, into slot
  // position % ring. ring_attention: each token's queries against its row's ring, keys
  // max(0, position - window) ..= position (all written). The caller keeps a call's per_row small
  // enough that the ring still holds every key its first query sees (ops::sliding_ring_required).
  virtual void rope_and_ring_write(float* qkv, int64_t ldqkv, const TokenLayout& layout, const RopeTable& rope,
                                   const AttentionShape& shape, const RingLayerView& ring) const = 0;
  virtual void ring_attention(const float* q, int64_t ldq, float* out, int64_t ldo, const TokenLayout& layout,
                              const AttentionShape& shape, const RingLayerView& ring) const = 0;
  // Log-decay linear attention per row (ops/linear_attention_step.h): the row qkv + i * ldqkv
  // holds q (q_heads x state_dim), k (kv_heads x state_dim), v (kv_heads x head_dim); a row's
  // tokens update its cache row's state (zeroed first at position 0) in order and write q_heads x
  // head_dim outputs to out + i * ldo. log_decay [kv_heads, state_dim] and decay = exp(log_decay),
  // host. A backend may run a row's tokens as one recurrence step each or in the chunked parallel
  // form (equal up to f32 rounding); the choice depends only on the row's token count.
  virtual void linear_attention_tokens(const float* qkv, int64_t ldqkv, float* out, int64_t ldo,
                                       const TokenLayout& layout, const AttentionShape& shape, const float* log_decay,
                                       const float* decay, float scale, const StateLayerView& state) const = 0;

  // ---- head
  // hidden [n, k] contiguous -> logits [n, V] (row stride V).
  virtual void lm_head(const PackedHead& head, const float* hidden, int64_t n, float* logits) const = 0;
  // ids[i] (host) = argmax over columns [0, limit) of lm_head's row i (limit <= 0 or > V: all),
  // first index on ties, exactly as a scan of that row with `>`; never materialises all logits.
  virtual void lm_head_argmax(const PackedHead& head, const float* hidden, int64_t n, int64_t* ids,
                              int64_t limit) const = 0;
};

// The CPU backend: the fused kernels and packed linears of kernels/cpu/ for active_isa().
const InferenceBackend& cpu_backend();

// Output rows per block of the CPU backend's packed LM head (the fused argmax keeps a running
// argmax over n x kCpuLmHeadBlock logits).
inline constexpr int64_t kCpuLmHeadBlock = 4096;

}  // namespace corelm::ops
