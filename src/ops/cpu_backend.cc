// The CPU inference backend: the former fast path of src/model/fast_forward.cc moved behind
// ops::InferenceBackend unchanged in numerics (the same kernels called in the same order on the
// same buffers). Linears are packed bf16, int8 or q4 for active_isa(); norms, RoPE, SwiGLU and
// attention are the fused kernels of kernels/cpu/fused.h; a quantized KV cache is read in place
// (kernels/cpu/kv_attention.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_attention.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_q4.h"
#include "ops/inference_backend.h"
#include "ops/linear_attention_step.h"
#include "ops/sliding_attention_ring.h"

namespace corelm::ops {
namespace {

// One packed linear in one of three packings; the other two members are empty.
class CpuLinear final : public PackedLinear {
 public:
  enum class Kind { BF16, Int8, Q4 };
  Kind kind = Kind::BF16;
  kernels::PackedLinear bf16;
  kernels::PackedLinearI8 i8;
  kernels::PackedLinearQ4 q4;
  int64_t n() const override { return kind == Kind::Int8 ? i8.n : kind == Kind::Q4 ? q4.n : bf16.n; }
  int64_t k() const override { return kind == Kind::Int8 ? i8.k : kind == Kind::Q4 ? q4.k : bf16.k; }
  // Y[m, n] = X[m, k] W^T (+ bias) with the kernel of the packing.
  void run(const float* X, int64_t m, int64_t ldx, float* Y, int64_t ldy) const {
    switch (kind) {
      case Kind::Int8: return kernels::linear_int8(X, m, ldx, i8, Y, ldy);
      case Kind::Q4: return kernels::linear_q4(X, m, ldx, q4, Y, ldy);
      case Kind::BF16: return kernels::linear_bf16(X, m, ldx, bf16, Y, ldy);
    }
  }
};

CpuLinear pack_cpu_linear(const float* W, int64_t n, int64_t k, const float* bias, WeightFormat format) {
  CpuLinear out;
  switch (format) {
    case WeightFormat::Int8:
      out.kind = CpuLinear::Kind::Int8;
      out.i8 = kernels::pack_linear_int8(W, n, k, k, bias);
      break;
    case WeightFormat::Q4:
      out.kind = CpuLinear::Kind::Q4;
      out.q4 = kernels::pack_linear_q4(W, n, k, k, bias, kernels::preferred_q4_format());
      break;
    case WeightFormat::BF16:
      out.kind = CpuLinear::Kind::BF16;
      out.bf16 = kernels::pack_linear_bf16(W, n, k, k, bias, kernels::preferred_linear_bf16_kernel());
      break;
  }
  return out;
}

class CpuVector final : public PackedVector {
 public:
  std::vector<float> values;
  int64_t size() const override { return static_cast<int64_t>(values.size()); }
};

// The LM head in blocks of kCpuLmHeadBlock rows. Int8 and q4 scales are per output row (q4: per 32
// inputs of it) and bf16 rounds each weight alone, so a block packs exactly the rows the whole
// matrix would.
class CpuHead final : public PackedHead {
 public:
  std::vector<CpuLinear> blocks;
  int64_t V = 0;
  int64_t vocab() const override { return V; }
};

class CpuRopeTable final : public RopeTable {
 public:
  CpuRopeTable(int64_t head_dim, int64_t n, float theta) : table(head_dim, n, theta) {}
  kernels::RopeTable table;
  int64_t positions() const override { return table.max_positions; }
};

// Sized by use, not by max_position_embeddings: a config claiming a 16M context would otherwise
// cost gigabytes and minutes of trigonometry before the first token. Entries do not depend on the
// table size, so growing never changes a result.
class CpuRopeTables final : public RopeTables {
 public:
  CpuRopeTables(int64_t head_dim, float theta) : head_dim_(head_dim), theta_(theta) {}
  std::shared_ptr<const RopeTable> at_least(int64_t positions) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!table_ || table_->positions() < positions) {
      // Doubling keeps a decode that advances one position per step from rebuilding each step.
      const int64_t have = table_ ? table_->positions() : 0;
      const int64_t n = std::max<int64_t>({positions, 2 * have, 8192});
      table_ = std::make_shared<const CpuRopeTable>(head_dim_, n, theta_);
    }
    return table_;
  }

 private:
  int64_t head_dim_;
  float theta_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const CpuRopeTable> table_;
};

const CpuLinear& cpu(const PackedLinear& w) { return static_cast<const CpuLinear&>(w); }
const CpuHead& cpu(const PackedHead& w) { return static_cast<const CpuHead&>(w); }
const CpuVector& cpu(const PackedVector& w) { return static_cast<const CpuVector&>(w); }
const kernels::RopeTable& cpu(const RopeTable& t) { return static_cast<const CpuRopeTable&>(t).table; }

float* fit(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

class CpuBackend final : public InferenceBackend {
 public:
  const char* name() const override { return "cpu"; }

  std::unique_ptr<PackedLinear> pack_linear(const float* W, int64_t n, int64_t k, const float* bias,
                                            WeightFormat format) const override {
    return std::make_unique<CpuLinear>(pack_cpu_linear(W, n, k, bias, format));
  }

  std::unique_ptr<PackedVector> pack_vector(const float* x, int64_t n) const override {
    auto out = std::make_unique<CpuVector>();
    out->values.assign(x, x + n);
    return out;
  }

  std::unique_ptr<PackedHead> pack_head(const float* W, int64_t V, int64_t k, WeightFormat format) const override {
    auto out = std::make_unique<CpuHead>();
    out->V = V;
    for (int64_t r0 = 0; r0 < V; r0 += kCpuLmHeadBlock)
      out->blocks.push_back(pack_cpu_linear(W + r0 * k, std::min(kCpuLmHeadBlock, V - r0), k, nullptr, format));
    return out;
  }

  std::unique_ptr<RopeTables> make_rope_tables(int64_t head_dim, float theta) const override {
    return std::make_unique<CpuRopeTables>(head_dim, theta);
  }

  float* scratch(Scratch slot, int64_t n) const override {
    thread_local std::array<std::vector<float>, static_cast<size_t>(Scratch::Count)> buffers;
    return fit(buffers[static_cast<size_t>(slot)], n);
  }

  void copy(float* dst, const float* src, int64_t n) const override {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }

  void gather_rows(const float* table, int64_t width, const int64_t* ids, int64_t n, float* x) const override {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(x + i * width, table + ids[i] * width, static_cast<size_t>(width) * sizeof(float));
  }

  void linear(const PackedLinear& W, const float* X, int64_t m, int64_t ldx, float* Y, int64_t ldy) const override {
    cpu(W).run(X, m, ldx, Y, ldy);
  }

  void rms_norm(const float* x, int64_t ldx, const PackedVector& weight, float* y, int64_t ldy, int64_t rows,
                float eps) const override {
    const CpuVector& w = cpu(weight);
    kernels::fused_rms_norm(x, ldx, w.values.data(), y, ldy, rows, w.size(), eps);
  }

  void add_inplace(float* x, const float* y, int64_t n) const override {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n) const override {
    kernels::fused_swiglu(gu, ldgu, y, ldy, rows, n);
  }

  void rope_and_cache_write(float* qkv, int64_t ldqkv, const TokenLayout& layout, const RopeTable& rope,
                            const AttentionShape& shape, const KVLayerView& cache) const override;
  void cached_attention(const float* q, int64_t ldq, float* out, int64_t ldo, const TokenLayout& layout,
                        const AttentionShape& shape, const KVLayerView& cache) const override;

  void rope_and_ring_write(float* qkv, int64_t ldqkv, const TokenLayout& layout, const RopeTable& rope,
                           const AttentionShape& shape, const RingLayerView& ring) const override;
  void ring_attention(const float* q, int64_t ldq, float* out, int64_t ldo, const TokenLayout& layout,
                      const AttentionShape& shape, const RingLayerView& ring) const override;
  void linear_attention_tokens(const float* qkv, int64_t ldqkv, float* out, int64_t ldo, const TokenLayout& layout,
                               const AttentionShape& shape, const float* log_decay, const float* decay, float scale,
                               const StateLayerView& state) const override;

  void lm_head(const PackedHead& head, const float* hidden, int64_t n, float* logits) const override {
    const CpuHead& h = cpu(head);
    int64_t col = 0;
    for (const CpuLinear& b : h.blocks) {
      b.run(hidden, n, b.k(), logits + col, h.V);
      col += b.n();
    }
  }

  void lm_head_argmax(const PackedHead& head, const float* hidden, int64_t n, int64_t* ids,
                      int64_t limit) const override;
};

bool all_f32(const KVLayerView& c) { return c.k_format == KVFormat::F32 && c.v_format == KVFormat::F32; }

void CpuBackend::rope_and_cache_write(float* qkv, int64_t ldqkv, const TokenLayout& layout, const RopeTable& rope,
                                      const AttentionShape& shape, const KVLayerView& cache) const {
  const kernels::RopeTable& table = cpu(rope);
  const int64_t Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim, Q = Hq * D, KV = Hkv * D;
  const int64_t cap = cache.capacity, krb = cache.k_row_bytes, vrb = cache.v_row_bytes;
  // f32 caches keep plain copies; any other type is written encoded and read in place.
  const bool f32 = all_f32(cache);
  auto* kb = static_cast<uint8_t*>(cache.k);
  auto* vb = static_cast<uint8_t*>(cache.v);
  auto* kc = static_cast<float*>(cache.k);
  auto* vc = static_cast<float*>(cache.v);
  const int64_t N = layout.tokens();
  for (int64_t i = 0; i < N; ++i) {
    const int64_t pos = layout.position(i);
    float* row = qkv + i * ldqkv;
    kernels::fused_rope_inplace(row, Hq, table, pos);
    kernels::fused_rope_inplace(row + Q, Hkv, table, pos);
    const int64_t r = layout.cache_row[layout.row_of(i)];
    for (int64_t g = 0; g < Hkv; ++g) {
      const int64_t at = (r * Hkv + g) * cap + pos;  // entry index
      if (f32) {
        std::memcpy(kc + at * D, row + Q + g * D, static_cast<size_t>(D) * sizeof(float));
        std::memcpy(vc + at * D, row + Q + KV + g * D, static_cast<size_t>(D) * sizeof(float));
      } else {
        kernels::kv_encode_row(cache.k_format, row + Q + g * D, D, kb + at * krb);
        kernels::kv_encode_row(cache.v_format, row + Q + KV + g * D, D, vb + at * vrb);
      }
    }
  }
}

void CpuBackend::rope_and_ring_write(float* qkv, int64_t ldqkv, const TokenLayout& layout, const RopeTable& rope,
                                     const AttentionShape& shape, const RingLayerView& ring) const {
  const kernels::RopeTable& table = cpu(rope);
  const int64_t Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim, Q = Hq * D, KV = Hkv * D;
  for (int64_t i = 0; i < layout.tokens(); ++i) {
    const int64_t pos = layout.position(i);
    float* row = qkv + i * ldqkv;
    kernels::fused_rope_inplace(row, Hq, table, pos);
    kernels::fused_rope_inplace(row + Q, Hkv, table, pos);
    const int64_t r = layout.cache_row[layout.row_of(i)];
    for (int64_t g = 0; g < Hkv; ++g) {
      const int64_t at = ((r * Hkv + g) * ring.ring + sliding_ring_slot(pos, ring.ring)) * D;
      std::memcpy(ring.k + at, row + Q + g * D, static_cast<size_t>(D) * sizeof(float));
      std::memcpy(ring.v + at, row + Q + KV + g * D, static_cast<size_t>(D) * sizeof(float));
    }
  }
}

void CpuBackend::ring_attention(const float* q, int64_t ldq, float* out, int64_t ldo, const TokenLayout& layout,
                                const AttentionShape& shape, const RingLayerView& ring) const {
  const int64_t Hkv = shape.kv_heads, D = shape.head_dim, T = layout.per_row;
  const SlidingRingShape rs{shape.q_heads, Hkv, D, ring.ring, ring.window, 0, shape.scale};
  for (int64_t b = 0; b < layout.rows; ++b) {
    const int64_t base = layout.cache_row[b] * Hkv * ring.ring * D;
    sliding_ring_attention(q + b * T * ldq, ldq, ring.k + base, ring.v + base, out + b * T * ldo, ldo, T,
                           layout.start[b] + layout.offset, rs);
  }
}

// Rows of at least this many tokens run the chunked form (a prefill: the training op's chunk loop,
// so a prefill gives the training forward's bits); shorter runs (decode, a few draft tokens) step
// the recurrence. Measured per token on one core (docs/HYBRID.md, "Chunked prefill"): at the
// preset's d_state 32 x head_dim 32 the two forms cost the same to within ~10% (~0.5-0.9 us, under
// 1% of a token's forward); from 64 x 64 on the chunked form is faster (2x at 128 x 128), from
// about 16 tokens.
constexpr int64_t kChunkedPrefillMinTokens = 16;

void CpuBackend::linear_attention_tokens(const float* qkv, int64_t ldqkv, float* out, int64_t ldo,
                                         const TokenLayout& layout, const AttentionShape& shape,
                                         const float* log_decay, const float* decay, float scale,
                                         const StateLayerView& state) const {
  const int64_t Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim, ds = state.state_dim;
  const LinearAttentionStepShape ls{Hq, Hkv, ds, D};
  const int64_t per_state = Hkv * ds * D, T = layout.per_row;
  // The recurrence is sequential along a row; rows are independent, so a row's result never
  // depends on the others or on the thread count (each row runs on one thread, in a fixed order,
  // and whether it is chunked depends on its own token count only).
  parallel_for(layout.rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* S = state.state + layout.cache_row[b] * per_state;
      const int64_t i0 = b * T;
      const bool fresh = layout.position(i0) == 0;
      if (fresh) std::fill(S, S + per_state, 0.0f);
      if (T >= kChunkedPrefillMinTokens) {
        const float* row = qkv + i0 * ldqkv;
        const LinearAttentionRun run{row, row + Hq * ds, row + (Hq + Hkv) * ds, ldqkv, out + i0 * ldo, ldo, T};
        linear_attention_prefill(S, fresh, run, log_decay, ls, scale);
        continue;
      }
      for (int64_t t = 0; t < T; ++t) {
        const float* row = qkv + (i0 + t) * ldqkv;
        linear_attention_step(S, row, row + Hq * ds, row + (Hq + Hkv) * ds, decay, out + (i0 + t) * ldo, ls, scale);
      }
    }
  });
}

void CpuBackend::cached_attention(const float* q, int64_t ldq, float* out, int64_t ldo, const TokenLayout& layout,
                                  const AttentionShape& shape, const KVLayerView& cache) const {
  const int64_t Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim, cap = cache.capacity;
  const kernels::CachedAttention kshape{Hq, Hkv, D, cap, shape.scale};
  const kernels::QuantCacheFormats formats{cache.k_format, cache.v_format};
  const bool f32 = all_f32(cache);
  const auto* kb = static_cast<const uint8_t*>(cache.k);
  const auto* vb = static_cast<const uint8_t*>(cache.v);
  const auto* kc = static_cast<const float*>(cache.k);
  const auto* vc = static_cast<const float*>(cache.v);
  const int64_t krb = cache.k_row_bytes, vrb = cache.v_row_bytes, n = layout.tokens();
  const int64_t n_items = f32 ? n * Hq : n * Hkv;
  // f32: one work item per (token, query head). Encoded caches: one per (token, kv head), the
  // kernel decoding each cache row once for the query heads that share it (GQA). Either way an
  // item writes only its own output slice, in a fixed order. Few items (decoding one row) go one
  // per chunk so a second thread still gets heads to do.
  parallel_for(n_items, n_items >= 64 ? 4 : 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      if (f32) {
        const int64_t i = item / Hq, head = item % Hq;
        const int64_t r = layout.cache_row[layout.row_of(i)], pos = layout.position(i);
        const int64_t row_base = r * Hkv * cap * D;
        kernels::fused_attention_head(q + i * ldq + head * D, kc + row_base, vc + row_base, out + i * ldo + head * D,
                                      head, pos, kshape);
      } else {
        const int64_t i = item / Hkv, g = item % Hkv, first = g * (Hq / Hkv);
        const int64_t r = layout.cache_row[layout.row_of(i)], pos = layout.position(i);
        kernels::quant_attention_group(q + i * ldq + first * D, kb + r * Hkv * cap * krb, vb + r * Hkv * cap * vrb,
                                       out + i * ldo + first * D, g, pos, kshape, formats);
      }
    }
  });
}

void CpuBackend::lm_head_argmax(const PackedHead& head, const float* hidden, int64_t n, int64_t* ids,
                                int64_t limit) const {
  if (n <= 0) return;
  const CpuHead& h = cpu(head);
  if (limit <= 0 || limit > h.V) limit = h.V;
  float* y = scratch(Scratch::HeadLogits, n * kCpuLmHeadBlock);
  float* best = scratch(Scratch::HeadBest, n);
  // The running scan visits columns in order with `>`, as a plain argmax over the row does: the
  // first index wins ties, and a NaN neither wins nor (after column 0) is chosen.
  int64_t col = 0;
  for (const CpuLinear& b : h.blocks) {
    if (col >= limit) break;
    const int64_t bn = b.n(), cols = std::min(bn, limit - col);
    b.run(hidden, n, b.k(), y, bn);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = y + i * bn;
      int64_t j = 0;
      if (col == 0) {
        best[i] = row[0];
        ids[i] = 0;
        j = 1;
      }
      float m = best[i];
      int64_t arg = ids[i];
      for (; j < cols; ++j)
        if (row[j] > m) {
          m = row[j];
          arg = col + j;
        }
      best[i] = m;
      ids[i] = arg;
    }
    col += bn;
  }
}

}  // namespace

const InferenceBackend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace corelm::ops
