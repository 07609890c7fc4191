// Full (GQA, RoPE) attention: training forward on the ops, the reference incremental forward
// (attention run per row against that row's slice of the KV cache) and the inference forward
// against a backend (fused RMSNorm -> one QKV linear -> RoPE on q/k in place with k/v written into
// the cache -> attention against each row's cache -> o linear -> residual).
#include "model/blocks/attention.h"

#include <cmath>

#include "corelm/ops.h"

namespace corelm::model::blocks {
namespace {

int64_t head_dim_of(const ModelConfig& c) {
  return c.head_dim == 0 ? c.hidden_size / c.num_attention_heads : c.head_dim;
}

// [B*T, heads*D] -> [B, heads, T, D]
Tensor split_heads(const Tensor& x, int64_t B, int64_t T, int64_t heads, int64_t D) {
  return ops::transpose(ops::reshape(x, {B, T, heads, D}), 1, 2);
}
// [B, heads, T, D] -> [B*T, heads*D]
Tensor merge_heads(const Tensor& x, int64_t B, int64_t T, int64_t D) {
  return ops::reshape(ops::transpose(x, 1, 2), {B * T, x.size(1) * D});
}


ops::KVLayerView view_of(KVCache& cache, int64_t layer) {
  ops::KVLayerView v;
  v.k = cache.k_bytes(layer).raw_data();
  v.v = cache.v_bytes(layer).raw_data();
  v.k_format = static_cast<ops::KVFormat>(static_cast<int>(cache.types().k));
  v.v_format = static_cast<ops::KVFormat>(static_cast<int>(cache.types().v));
  v.k_row_bytes = cache.k_row_bytes();
  v.v_row_bytes = cache.v_row_bytes();
  v.capacity = cache.capacity();
  return v;
}

}  // namespace

// The training forward of full (window 0) and sliding-window attention: they differ only in
// which keys a query sees. With doc_ids (bos_isolation) both go through the sliding-window op,
// which masks keys of other documents; a plain full layer keeps the causal op.
Tensor attention_forward(const ModelConfig& c, const LayerParams& p, const Tensor& x, const ForwardContext& ctx,
                         int64_t window) {
  const int64_t B = ctx.B, T = ctx.T, D = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps), theta = static_cast<float>(c.rope_theta);
  Tensor h = ops::rms_norm(x, p.get("input_layernorm.weight"), eps);
  Tensor q = ops::rope(split_heads(ops::linear(h, p.get("self_attn.q_proj.weight"), p.get_opt("self_attn.q_proj.bias")),
                                   B, T, c.num_attention_heads, D),
                       theta);
  Tensor k = ops::rope(split_heads(ops::linear(h, p.get("self_attn.k_proj.weight"), p.get_opt("self_attn.k_proj.bias")),
                                   B, T, c.num_key_value_heads, D),
                       theta);
  Tensor v = split_heads(ops::linear(h, p.get("self_attn.v_proj.weight"), p.get_opt("self_attn.v_proj.bias")), B, T,
                         c.num_key_value_heads, D);
  Tensor o = window == 0 && !ctx.doc_ids.defined() ? ops::causal_attention(q, k, v)
                                                   : ops::sliding_window_attention(q, k, v, window, ctx.doc_ids);
  Tensor a = merge_heads(o, B, T, D);
  return ops::add(x, ops::linear(a, p.get("self_attn.o_proj.weight"), p.get_opt("self_attn.o_proj.bias")));
}

void attention_parameter_shapes(const ModelConfig& c, const std::string& p, ShapeList& proj, ShapeList& norms) {
  const int64_t D = head_dim_of(c), H = c.hidden_size;
  const int64_t Q = c.num_attention_heads * D, KV = c.num_key_value_heads * D;
  const bool bias = c.attention_bias;
  // Llama's attention_bias also puts a bias on o_proj; Qwen2 biases only q/k/v.
  const bool o_bias = bias && c.model_type == "llama";
  proj.emplace_back(p + "self_attn.q_proj.weight", Shape{Q, H});
  if (bias) proj.emplace_back(p + "self_attn.q_proj.bias", Shape{Q});
  proj.emplace_back(p + "self_attn.k_proj.weight", Shape{KV, H});
  if (bias) proj.emplace_back(p + "self_attn.k_proj.bias", Shape{KV});
  proj.emplace_back(p + "self_attn.v_proj.weight", Shape{KV, H});
  if (bias) proj.emplace_back(p + "self_attn.v_proj.bias", Shape{KV});
  proj.emplace_back(p + "self_attn.o_proj.weight", Shape{H, Q});
  if (o_bias) proj.emplace_back(p + "self_attn.o_proj.bias", Shape{H});
  norms.emplace_back(p + "input_layernorm.weight", Shape{H});
}

namespace {

class FullAttention final : public Block {
 public:
  const char* kind() const override { return "attention"; }

  void parameter_shapes(const ModelConfig& c, int64_t layer, const std::string& p, ShapeList& proj,
                        ShapeList& norms) const override {
    (void)layer;
    attention_parameter_shapes(c, p, proj, norms);
  }

  Tensor forward(const ModelConfig& c, const LayerParams& p, const Tensor& x, const ForwardContext& ctx) const override {
    return attention_forward(c, p, x, ctx, 0);
  }

  Tensor forward_cached(const ModelConfig& c, const LayerParams& p, const Tensor& x, KVCache& cache, int64_t l,
                        const CachedRows& at) const override {
    const int64_t B = at.B, T = at.T, D = c.head_dim;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
    const float eps = static_cast<float>(c.rms_norm_eps), theta = static_cast<float>(c.rope_theta);
    // The projections run batched over all rows; only attention needs each row's own history.
    Tensor h = ops::rms_norm(x, p.get("input_layernorm.weight"), eps);
    Tensor q = ops::linear(h, p.get("self_attn.q_proj.weight"), p.get_opt("self_attn.q_proj.bias"));
    Tensor k = ops::linear(h, p.get("self_attn.k_proj.weight"), p.get_opt("self_attn.k_proj.bias"));
    Tensor v = ops::linear(h, p.get("self_attn.v_proj.weight"), p.get_opt("self_attn.v_proj.bias"));
    std::vector<Tensor> row_out(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = at.rows[static_cast<size_t>(b)], s0 = at.start[static_cast<size_t>(b)];
      auto row_of = [&](const Tensor& t, int64_t heads) {
        return split_heads(t.slice(0, b * T, (b + 1) * T), 1, T, heads, D);
      };
      Tensor qb = ops::rope(row_of(q, Hq), theta, s0);
      Tensor kb = ops::rope(row_of(k, Hkv), theta, s0);
      Tensor vb = row_of(v, Hkv);
      Tensor keys, values;
      if (cache.types().all_f32()) {
        Tensor& kc = cache.k(l);
        Tensor& vc = cache.v(l);
        kc.slice(0, r, r + 1).slice(2, s0, s0 + T).copy_(kb);
        vc.slice(0, r, r + 1).slice(2, s0, s0 + T).copy_(vb);
        keys = kc.slice(0, r, r + 1).slice(2, 0, s0 + T);
        values = vc.slice(0, r, r + 1).slice(2, 0, s0 + T);
      } else {
        // Other types: encode the new positions, then attend over the whole row decoded to f32
        // (the readable yardstick; the fast path reads the codes in place).
        const Tensor kn = kb.contiguous(), vn = vb.contiguous();
        keys = Tensor::empty({1, Hkv, s0 + T, D});
        values = Tensor::empty({1, Hkv, s0 + T, D});
        for (int64_t g = 0; g < Hkv; ++g) {
          cache.store_keys(l, r, g, s0, T, kn.data<float>() + g * T * D);
          cache.store_values(l, r, g, s0, T, vn.data<float>() + g * T * D);
          cache.load_keys(l, r, g, 0, s0 + T, keys.data<float>() + g * (s0 + T) * D);
          cache.load_values(l, r, g, 0, s0 + T, values.data<float>() + g * (s0 + T) * D);
        }
      }
      row_out[static_cast<size_t>(b)] = merge_heads(ops::causal_attention(qb, keys, values), 1, T, D);
    }
    Tensor a = B == 1 ? row_out[0] : ops::concat(row_out, 0);
    return ops::add(x, ops::linear(a, p.get("self_attn.o_proj.weight"), p.get_opt("self_attn.o_proj.bias")));
  }

  std::unique_ptr<PackedBlock> pack(const ModelConfig& c, const LayerParams& p, const ops::InferenceBackend& be,
                                    ops::WeightFormat format) const override {
    return pack_attention(c, p, be, format);
  }

  void infer(const PackedBlock& packed, InferenceStep& s) const override {
    const PackedAttention& w = static_cast<const PackedAttention&>(packed);
    const ModelConfig& c = s.c;
    const int64_t H = c.hidden_size, D = c.head_dim, Q = c.q_dim(), QKV = Q + 2 * c.kv_dim();
    const int64_t N = s.layout.tokens();
    float* h = s.be.scratch(ops::Scratch::Hidden, N * H);
    float* qkv = s.be.scratch(ops::Scratch::QKV, N * QKV);
    const ops::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, D,
                                    1.0f / std::sqrt(static_cast<float>(D))};
    const ops::KVLayerView cache = view_of(s.cache, s.layer);
    s.be.rms_norm(s.x, H, *w.in_norm, h, H, N, static_cast<float>(c.rms_norm_eps));
    s.be.linear(*w.qkv, h, N, H, qkv, QKV);
    s.be.rope_and_cache_write(qkv, QKV, s.layout, s.rope, shape, cache);
    // With only the last tokens wanted, the work after the cache writes runs on those alone.
    if (s.last_only) s.keep_last_only(qkv, QKV, Q);
    const int64_t n = s.layout.tokens();
    float* attn = s.be.scratch(ops::Scratch::Attn, n * Q);
    float* tmp = s.be.scratch(ops::Scratch::Tmp, n * H);
    s.be.cached_attention(qkv, QKV, attn, Q, s.layout, shape, cache);
    s.be.linear(*w.o, attn, n, Q, tmp, H);
    s.be.add_inplace(s.x, tmp, n * H);
  }
};

}  // namespace

std::unique_ptr<PackedBlock> pack_attention(const ModelConfig& c, const LayerParams& p,
                                            const ops::InferenceBackend& be, ops::WeightFormat format) {
  const int64_t H = c.hidden_size;
  auto w = std::make_unique<PackedAttention>();
  w->in_norm = be.pack_vector(p.f32("input_layernorm.weight"), H);
  w->qkv = pack_rows(be, p, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, H, format);
  w->o = pack_rows(be, p, {"self_attn.o_proj"}, c.q_dim(), format);
  return w;
}

const Block& full_attention() {
  static const FullAttention block;
  return block;
}

}  // namespace corelm::model::blocks
