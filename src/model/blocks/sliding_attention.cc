// Sliding-window attention: the training forward is full attention's with the layer's window.
// The reference incremental forward keeps each row's keys/values in the layer's ring
// (KVCache::ring_k / ring_v, position p in slot p % ring_size): an append runs in chunks of at most
// KVCache::kRingChunk tokens, each written into the ring and then attending to the keys
// [p0 - W, p0 + n) gathered in order, which the ring (W + 1 + kRingChunk slots) still holds.
// The packed inference forward does the same through the backend (rope_and_ring_write, then
// ring_attention), per row and chunk of at most kRingChunk tokens.
#include "model/blocks/sliding_attention.h"

#include <algorithm>
#include <cmath>

#include "corelm/error.h"
#include "corelm/ops.h"
#include "model/blocks/attention.h"

namespace corelm::model::blocks {
namespace {

class SlidingAttention final : public Block {
 public:
  const char* kind() const override { return "sliding_attention"; }

  void parameter_shapes(const ModelConfig& c, int64_t layer, const std::string& p, ShapeList& proj,
                        ShapeList& norms) const override {
    (void)layer;
    attention_parameter_shapes(c, p, proj, norms);
  }

  Tensor forward(const ModelConfig& c, const LayerParams& p, const Tensor& x, const ForwardContext& ctx) const override {
    return attention_forward(c, p, x, ctx, c.layer(ctx.layer).window);
  }

  Tensor forward_cached(const ModelConfig& c, const LayerParams& p, const Tensor& x, KVCache& cache, int64_t l,
                        const CachedRows& at) const override {
    const int64_t B = at.B, T = at.T, D = c.head_dim, W = c.layer(l).window, R = cache.ring_size(l);
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
    const float eps = static_cast<float>(c.rms_norm_eps), theta = static_cast<float>(c.rope_theta);
    Tensor h = ops::rms_norm(x, p.get("input_layernorm.weight"), eps);
    Tensor q = ops::linear(h, p.get("self_attn.q_proj.weight"), p.get_opt("self_attn.q_proj.bias"));
    Tensor k = ops::linear(h, p.get("self_attn.k_proj.weight"), p.get_opt("self_attn.k_proj.bias"));
    Tensor v = ops::linear(h, p.get("self_attn.v_proj.weight"), p.get_opt("self_attn.v_proj.bias"));
    Tensor& ring_k = cache.ring_k(l);
    Tensor& ring_v = cache.ring_v(l);
    std::vector<Tensor> row_out(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = at.rows[static_cast<size_t>(b)], s0 = at.start[static_cast<size_t>(b)];
      auto row_of = [&](const Tensor& t, int64_t heads) {
        return ops::transpose(ops::reshape(t.slice(0, b * T, (b + 1) * T), {1, T, heads, D}), 1, 2);
      };
      const Tensor qb = ops::rope(row_of(q, Hq), theta, s0), kb = ops::rope(row_of(k, Hkv), theta, s0);
      const Tensor vb = row_of(v, Hkv);
      Tensor rk = ring_k.slice(0, r, r + 1), rv = ring_v.slice(0, r, r + 1);
      std::vector<Tensor> chunks;
      for (int64_t c0 = 0; c0 < T; c0 += KVCache::kRingChunk) {
        const int64_t n = std::min(KVCache::kRingChunk, T - c0), p0 = s0 + c0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t slot = (p0 + i) % R;
          rk.slice(2, slot, slot + 1).copy_(kb.slice(2, c0 + i, c0 + i + 1));
          rv.slice(2, slot, slot + 1).copy_(vb.slice(2, c0 + i, c0 + i + 1));
        }
        const int64_t first = std::max<int64_t>(0, p0 - W), L = p0 + n - first;
        Tensor keys = Tensor::empty({1, Hkv, L, D}), values = Tensor::empty({1, Hkv, L, D});
        for (int64_t j = 0; j < L; ++j) {
          const int64_t slot = (first + j) % R;
          keys.slice(2, j, j + 1).copy_(rk.slice(2, slot, slot + 1));
          values.slice(2, j, j + 1).copy_(rv.slice(2, slot, slot + 1));
        }
        chunks.push_back(ops::sliding_window_attention(qb.slice(2, c0, c0 + n), keys, values, W));
      }
      const Tensor o = chunks.size() == 1 ? chunks[0] : ops::concat(chunks, 2);
      row_out[static_cast<size_t>(b)] = ops::reshape(ops::transpose(o, 1, 2), {T, Hq * D});
    }
    Tensor a = B == 1 ? row_out[0] : ops::concat(row_out, 0);
    return ops::add(x, ops::linear(a, p.get("self_attn.o_proj.weight"), p.get_opt("self_attn.o_proj.bias")));
  }

  std::unique_ptr<PackedBlock> pack(const ModelConfig& c, const LayerParams& p, const ops::InferenceBackend& be,
                                    ops::WeightFormat format) const override {
    return pack_attention(c, p, be, format);  // the same weights as full attention
  }

  void infer(const PackedBlock& packed, InferenceStep& s) const override {
    const PackedAttention& w = static_cast<const PackedAttention&>(packed);
    const ModelConfig& c = s.c;
    const int64_t H = c.hidden_size, D = c.head_dim, Q = c.q_dim(), QKV = Q + 2 * c.kv_dim();
    const int64_t N = s.layout.tokens(), T = s.layout.per_row;
    float* h = s.be.scratch(ops::Scratch::Hidden, N * H);
    float* qkv = s.be.scratch(ops::Scratch::QKV, N * QKV);
    float* attn = s.be.scratch(ops::Scratch::Attn, N * Q);
    const ops::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, D,
                                    1.0f / std::sqrt(static_cast<float>(D))};
    const ops::RingLayerView ring{s.cache.ring_k(s.layer).data<float>(), s.cache.ring_v(s.layer).data<float>(),
                                  s.cache.ring_size(s.layer), c.layer(s.layer).window};
    s.be.rms_norm(s.x, H, *w.in_norm, h, H, N, static_cast<float>(c.rms_norm_eps));
    s.be.linear(*w.qkv, h, N, H, qkv, QKV);
    // Per row, chunks of at most kRingChunk tokens: each chunk's keys are written, then attended
    // while the ring still holds the oldest key its first query sees.
    for (int64_t b = 0; b < s.layout.rows; ++b)
      for (int64_t c0 = 0; c0 < T; c0 += KVCache::kRingChunk) {
        const int64_t n = std::min(KVCache::kRingChunk, T - c0);
        const ops::TokenLayout part{1, n, s.layout.offset + c0, s.layout.start + b, s.layout.cache_row + b};
        float* q = qkv + (b * T + c0) * QKV;
        s.be.rope_and_ring_write(q, QKV, part, s.rope, shape, ring);
        s.be.ring_attention(q, QKV, attn + (b * T + c0) * Q, Q, part, shape, ring);
      }
    if (s.last_only) s.keep_last_only(attn, Q, Q);
    const int64_t n = s.layout.tokens();
    float* tmp = s.be.scratch(ops::Scratch::Tmp, n * H);
    s.be.linear(*w.o, attn, n, Q, tmp, H);
    s.be.add_inplace(s.x, tmp, n * H);
  }
};

}  // namespace

const Block& sliding_attention() {
  static const SlidingAttention block;
  return block;
}

}  // namespace corelm::model::blocks
