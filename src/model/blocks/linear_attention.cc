// Log-decay linear attention (docs/HYBRID.md), training forward:
//   h = rms_norm(x);  q = q_proj(h) [B, Hq, T, d_s],  k = k_proj(h) [B, Hkv, T, d_s],
//   v = v_proj(h) [B, Hkv, T, D];  o = d_s^-1/2 · linear_attention(q, k, v, a = -exp(decay))
//   x + o_proj(rms_norm_per_head(o) · out_norm)
// No RoPE: the decay orders time. The scale is applied by the op (o = scale · Sᵀq), which is the
// same as scaling q. The reference incremental forward carries each row's state in the cache
// (KVCache::state): the op runs from it (from zeros at a row's position 0) and leaves its final
// state there. The packed inference forward runs the backend's linear_attention_tokens (a prefill
// in the chunked form, a decode step as one recurrence step), then the per-head norm and o_proj.
#include "model/blocks/linear_attention.h"

#include <cmath>

#include "corelm/error.h"
#include "corelm/ops.h"
#include "ops/linear_attention_step.h"

namespace corelm::model::blocks {
namespace {

struct Packed final : PackedBlock {
  std::unique_ptr<ops::PackedVector> in_norm, out_norm;
  std::unique_ptr<ops::PackedLinear> qkv;  // [Hq ds + Hkv ds + Hkv D, H]
  std::unique_ptr<ops::PackedLinear> o;    // [H, Hq D]
  std::vector<float> log_decay;            // -exp(w) [Hkv, ds], host: the chunked prefill's input
  std::vector<float> decay;                // exp(-exp(w)) [Hkv, ds], host: the decode step's factor
};

Tensor split_heads(const Tensor& x, int64_t B, int64_t T, int64_t heads, int64_t D) {
  return ops::transpose(ops::reshape(x, {B, T, heads, D}), 1, 2);
}
Tensor merge_heads(const Tensor& x, int64_t B, int64_t T, int64_t D) {
  return ops::reshape(ops::transpose(x, 1, 2), {B * T, x.size(1) * D});
}

class LinearAttention final : public Block {
 public:
  const char* kind() const override { return "linear_attention"; }

  // HF order: the projections, then the layer's own decay and output norm, then input_layernorm.
  void parameter_shapes(const ModelConfig& c, int64_t layer, const std::string& p, ShapeList& proj,
                        ShapeList& norms) const override {
    const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
    const int64_t ds = c.layer(layer).d_state;
    proj.emplace_back(p + "self_attn.q_proj.weight", Shape{Hq * ds, H});
    proj.emplace_back(p + "self_attn.k_proj.weight", Shape{Hkv * ds, H});
    proj.emplace_back(p + "self_attn.v_proj.weight", Shape{Hkv * D, H});
    proj.emplace_back(p + "self_attn.o_proj.weight", Shape{H, Hq * D});
    proj.emplace_back(p + "self_attn.decay", Shape{Hkv, ds});
    proj.emplace_back(p + "self_attn.out_norm.weight", Shape{D});
    norms.emplace_back(p + "input_layernorm.weight", Shape{H});
  }

  Tensor forward(const ModelConfig& c, const LayerParams& p, const Tensor& x, const ForwardContext& ctx) const override {
    const int64_t B = ctx.B, T = ctx.T, D = c.head_dim, ds = c.layer(ctx.layer).d_state;
    const float eps = static_cast<float>(c.rms_norm_eps);
    Tensor h = ops::rms_norm(x, p.get("input_layernorm.weight"), eps);
    Tensor q = split_heads(ops::linear(h, p.get("self_attn.q_proj.weight")), B, T, c.num_attention_heads, ds);
    Tensor k = split_heads(ops::linear(h, p.get("self_attn.k_proj.weight")), B, T, c.num_key_value_heads, ds);
    Tensor v = split_heads(ops::linear(h, p.get("self_attn.v_proj.weight")), B, T, c.num_key_value_heads, D);
    Tensor a = ops::neg(ops::exp(p.get("self_attn.decay")));
    Tensor o = ops::linear_attention(q, k, v, a, ctx.doc_ids, Tensor(), nullptr,
                                     1.0f / std::sqrt(static_cast<float>(ds)));
    o = ops::rms_norm(o, p.get("self_attn.out_norm.weight"), eps);  // per head: the last dim is D
    return ops::add(x, ops::linear(merge_heads(o, B, T, D), p.get("self_attn.o_proj.weight")));
  }

  Tensor forward_cached(const ModelConfig& c, const LayerParams& p, const Tensor& x, KVCache& cache, int64_t l,
                        const CachedRows& at) const override {
    const int64_t B = at.B, T = at.T, D = c.head_dim, ds = c.layer(l).d_state;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
    const float eps = static_cast<float>(c.rms_norm_eps);
    Tensor h = ops::rms_norm(x, p.get("input_layernorm.weight"), eps);
    Tensor q = ops::linear(h, p.get("self_attn.q_proj.weight"));
    Tensor k = ops::linear(h, p.get("self_attn.k_proj.weight"));
    Tensor v = ops::linear(h, p.get("self_attn.v_proj.weight"));
    const Tensor a = ops::neg(ops::exp(p.get("self_attn.decay")));
    Tensor& state = cache.state(l);
    std::vector<Tensor> row_out(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = at.rows[static_cast<size_t>(b)], s0 = at.start[static_cast<size_t>(b)];
      auto row_of = [&](const Tensor& t, int64_t heads, int64_t width) {
        return split_heads(t.slice(0, b * T, (b + 1) * T), 1, T, heads, width);
      };
      Tensor row_state = state.slice(0, r, r + 1);
      Tensor final_state;
      Tensor o = ops::linear_attention(row_of(q, Hq, ds), row_of(k, Hkv, ds), row_of(v, Hkv, D), a, Tensor(),
                                       s0 == 0 ? Tensor() : row_state, &final_state,
                                       1.0f / std::sqrt(static_cast<float>(ds)));
      row_state.copy_(final_state);
      row_out[static_cast<size_t>(b)] = merge_heads(ops::rms_norm(o, p.get("self_attn.out_norm.weight"), eps), 1, T, D);
    }
    Tensor o = B == 1 ? row_out[0] : ops::concat(row_out, 0);
    return ops::add(x, ops::linear(o, p.get("self_attn.o_proj.weight")));
  }

  std::unique_ptr<PackedBlock> pack(const ModelConfig& c, const LayerParams& p, const ops::InferenceBackend& be,
                                    ops::WeightFormat format) const override {
    auto w = std::make_unique<Packed>();
    w->in_norm = be.pack_vector(p.f32("input_layernorm.weight"), c.hidden_size);
    w->out_norm = be.pack_vector(p.f32("self_attn.out_norm.weight"), c.head_dim);
    w->qkv = pack_rows(be, p, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, c.hidden_size, format);
    w->o = pack_rows(be, p, {"self_attn.o_proj"}, c.num_attention_heads * c.head_dim, format);
    // The same factors as the training op: a = -exp(w) on the ops, then exp(a) as the kernels take it.
    const Tensor a = ops::neg(ops::exp(p.get("self_attn.decay"))).contiguous();
    const Tensor decay = ops::linear_attention_decay(a).contiguous();
    w->log_decay.assign(a.data<float>(), a.data<float>() + a.numel());
    w->decay.assign(decay.data<float>(), decay.data<float>() + decay.numel());
    return w;
  }

  void infer(const PackedBlock& packed, InferenceStep& s) const override {
    const Packed& w = static_cast<const Packed&>(packed);
    const ModelConfig& c = s.c;
    const int64_t H = c.hidden_size, D = c.head_dim, ds = c.layer(s.layer).d_state;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, O = Hq * D;
    const int64_t QKV = (Hq + Hkv) * ds + Hkv * D, N = s.layout.tokens();
    const float eps = static_cast<float>(c.rms_norm_eps);
    float* h = s.be.scratch(ops::Scratch::Hidden, N * H);
    float* qkv = s.be.scratch(ops::Scratch::QKV, N * QKV);
    float* attn = s.be.scratch(ops::Scratch::Attn, N * O);
    float* normed = s.be.scratch(ops::Scratch::Mid, N * O);
    s.be.rms_norm(s.x, H, *w.in_norm, h, H, N, eps);
    s.be.linear(*w.qkv, h, N, H, qkv, QKV);
    const ops::AttentionShape shape{Hq, Hkv, D, 1.0f};
    const ops::StateLayerView state{s.cache.state(s.layer).data<float>(), ds};
    s.be.linear_attention_tokens(qkv, QKV, attn, O, s.layout, shape, w.log_decay.data(), w.decay.data(),
                                 1.0f / std::sqrt(static_cast<float>(ds)), state);
    s.be.rms_norm(attn, D, *w.out_norm, normed, D, N * Hq, eps);  // per head
    if (s.last_only) s.keep_last_only(normed, O, O);
    const int64_t n = s.layout.tokens();
    float* tmp = s.be.scratch(ops::Scratch::Tmp, n * H);
    s.be.linear(*w.o, normed, n, O, tmp, H);
    s.be.add_inplace(s.x, tmp, n * H);
  }
};

}  // namespace

const Block& linear_attention() {
  static const LinearAttention block;
  return block;
}

std::vector<float> linear_attention_decay_init(int64_t d_state) {
  std::vector<float> w(static_cast<size_t>(d_state));
  const double span = static_cast<double>(d_state > 1 ? d_state - 1 : 1);
  for (int64_t i = 0; i < d_state; ++i) {
    const double lambda = 1.0 - std::pow(2.0, -(1.0 + 9.0 * static_cast<double>(i) / span));
    w[static_cast<size_t>(i)] = static_cast<float>(std::log(-std::log(lambda)));
  }
  return w;
}

}  // namespace corelm::model::blocks
