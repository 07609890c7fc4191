// Decoder: the Llama/Qwen2 forward pass written with the differentiable ops, so training gets
// its backward from autograd; forward_cached reuses the same layer code under NoGradGuard with
// attention run per row against that row's slice of the KV cache.
#include <algorithm>
#include <set>
#include <stdexcept>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "model/fast_forward.h"

namespace corelm::model {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

void check_ids(const Tensor& ids, const char* fn) {
  CORELM_CHECK(ids.defined(), ValueError, "Decoder::", fn, ": ids undefined");
  CORELM_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, DTypeError, "Decoder::", fn,
               ": ids must be i32 or i64, got ", dtype_name(ids.dtype()));
  CORELM_CHECK(ids.dim() == 2, ShapeError, "Decoder::", fn, ": ids must be [B, T], got ", shape_str(ids.shape()));
}

}  // namespace

std::vector<std::pair<std::string, Shape>> parameter_shapes(const ModelConfig& config) {
  const int64_t D = config.head_dim == 0 ? config.hidden_size / config.num_attention_heads : config.head_dim;
  const int64_t H = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  const int64_t Q = config.num_attention_heads * D, KV = config.num_key_value_heads * D;
  const bool bias = config.attention_bias;
  // Llama's attention_bias also puts a bias on o_proj; Qwen2 biases only q/k/v.
  const bool o_bias = bias && config.model_type == "llama";
  std::vector<std::pair<std::string, Shape>> out;
  auto add = [&](std::string name, Shape shape) { out.emplace_back(std::move(name), std::move(shape)); };
  // Same order as HF's named_parameters(): attention, mlp, then the two norms of each layer.
  add("model.embed_tokens.weight", {V, H});
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    add(p + "self_attn.q_proj.weight", {Q, H});
    if (bias) add(p + "self_attn.q_proj.bias", {Q});
    add(p + "self_attn.k_proj.weight", {KV, H});
    if (bias) add(p + "self_attn.k_proj.bias", {KV});
    add(p + "self_attn.v_proj.weight", {KV, H});
    if (bias) add(p + "self_attn.v_proj.bias", {KV});
    add(p + "self_attn.o_proj.weight", {H, Q});
    if (o_bias) add(p + "self_attn.o_proj.bias", {H});
    add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H});
    add(p + "mlp.down_proj.weight", {H, I});
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
  }
  add("model.norm.weight", {H});
  if (!config.tie_word_embeddings) add("lm_head.weight", {V, H});
  if (config.has_classifier()) add("score.weight", {static_cast<int64_t>(config.labels.size()), H});
  return out;
}

Decoder::Decoder(ModelConfig config) : config_(std::move(config)) {
  if (config_.head_dim == 0) {
    config_.validate();  // names the failing field, e.g. heads not dividing hidden_size
    config_.head_dim = config_.hidden_size / config_.num_attention_heads;
  }
  config_.validate();
  // The per-layer specs parse and round-trip; the sliding-window and linear-attention blocks are
  // not wired into the decoder yet (issue 17), so refuse rather than compute full attention.
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l)
    CORELM_CHECK(config_.layer(l).attention == AttentionKind::Full, ValueError, "Decoder: layer ", l, " is ",
                 attention_kind_name(config_.layer(l).attention),
                 "; this build's decoder computes full_attention layers only");
  for (auto& [name, shape] : parameter_shapes(config_)) {
    index_[name] = params_.size();
    params_.emplace_back(name, Tensor::zeros(shape));
  }
  for (auto& [name, t] : params_)
    if (ends_with(name, "norm.weight")) t.fill_(1.0);
}

void Decoder::init_weights(uint64_t seed) {
  autograd::NoGradGuard no_grad;
  Generator gen(seed);
  for (auto& [name, t] : params_) {
    if (ends_with(name, "norm.weight")) {
      t.fill_(1.0);
    } else if (ends_with(name, ".bias")) {
      t.fill_(0.0);
    } else {
      t.copy_(Tensor::randn(t.shape(), gen, static_cast<float>(config_.initializer_range)));
    }
  }
}

std::vector<Tensor> Decoder::parameters() const {
  std::vector<Tensor> out;
  out.reserve(params_.size());
  for (const auto& [name, t] : params_) out.push_back(t);
  return out;
}

Tensor& Decoder::parameter(const std::string& name) {
  auto it = index_.find(name);
  CORELM_CHECK(it != index_.end(), IndexError, "Decoder: no parameter named '", name, "' (", params_.size(),
               " parameters, e.g. '", params_.front().first, "')");
  return params_[it->second].second;
}

bool Decoder::has_parameter(const std::string& name) const { return index_.count(name) != 0; }

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::BF16: return "bf16";
    case Precision::Int8: return "int8";
    case Precision::Q4: return "q4";
    case Precision::F32: break;
  }
  return "f32";
}

Precision parse_precision(const std::string& s) {
  if (s == "f32") return Precision::F32;
  if (s == "bf16") return Precision::BF16;
  if (s == "int8") return Precision::Int8;
  if (s == "q4") return Precision::Q4;
  throw ValueError("unknown precision '" + s + "' (use f32, bf16, int8 or q4)");
}

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names{"f32", "bf16", "int8", "q4"};
  return names;
}

void Decoder::set_kv_cache_types(KVCacheTypes types) {
  // A type the head_dim does not fit fails here, naming it, rather than at the first cache.
  (void)KVCache(config_, 1, 1, types);
  kv_types_ = types;
}

KVCache Decoder::make_cache(int64_t batch, int64_t capacity) const {
  return KVCache(config_, batch, capacity, kv_types_);
}

void Decoder::prepare_inference(Precision p) {
  fast_.reset();  // free the old packing before building a new one
  if (p != Precision::F32) fast_ = std::make_shared<const FastWeights>(pack_fast_weights(*this, p));
  fast_precision_ = p;
  prepared_ = true;
}

void Decoder::drop_inference() {
  fast_.reset();
  prepared_ = false;
}

void Decoder::load_parameter(const std::string& name, const Tensor& value) {
  drop_inference();  // the packed copy would be stale
  Tensor& p = parameter(name);
  CORELM_CHECK(value.defined(), ValueError, "Decoder::load_parameter '", name, "': undefined tensor");
  CORELM_CHECK(value.shape() == p.shape(), ShapeError, "Decoder::load_parameter '", name, "': shape ",
               shape_str(value.shape()), " does not match the model's ", shape_str(p.shape()));
  CORELM_CHECK(is_floating(value.dtype()), DTypeError, "Decoder::load_parameter '", name, "': dtype ",
               dtype_name(value.dtype()), " is not a float type");
  autograd::NoGradGuard no_grad;
  p.copy_(value);
}

void Decoder::set_requires_grad(bool value) {
  for (auto& [name, t] : params_) t.set_requires_grad(value);
}

// ---------------------------------------------------------------- forward

namespace {

// Views of one layer's parameters, looked up once per forward.
struct LayerWeights {
  Tensor in_norm, q, q_b, k, k_b, v, v_b, o, o_b, post_norm, gate, up, down;
};

}  // namespace

namespace {
std::vector<int64_t> all_rows(int64_t B) {
  std::vector<int64_t> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) rows[static_cast<size_t>(b)] = b;
  return rows;
}
}  // namespace

// Without gradient recording, a prepared fast path also serves full-sequence inference (eval,
// scoring) through a throwaway cache; training always takes the op path below.
Tensor Decoder::forward(const Tensor& ids) const {
  if (fast_ && !autograd::grad_mode_enabled()) {
    check_ids(ids, "forward");
    CORELM_CHECK(ids.size(1) <= config_.max_position_embeddings, ValueError, "Decoder::forward: sequence length ",
                 ids.size(1), " exceeds max_position_embeddings ", config_.max_position_embeddings);
    KVCache cache = make_cache(std::max<int64_t>(ids.size(0), 1), std::max<int64_t>(ids.size(1), 1));
    return forward_cached(ids, cache, all_rows(ids.size(0)), Logits::All);
  }
  return lm_head(forward_hidden(ids));
}

std::string Decoder::lm_head_weight_name() const {
  return config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
}

const Tensor& Decoder::lm_head_weight() const { return params_[index_.at(lm_head_weight_name())].second; }

const Tensor& Decoder::classifier_weight() const {
  CORELM_CHECK(config_.has_classifier(), ValueError, "this model has no classification head (score.weight); ",
               "train one with corelm train --task classify");
  return params_[index_.at("score.weight")].second;
}

Tensor Decoder::lm_head(const Tensor& hidden) const {
  const Tensor& w = lm_head_weight();
  CORELM_CHECK(hidden.defined() && hidden.dim() >= 1 && hidden.size(-1) == config_.hidden_size, ShapeError,
               "Decoder::lm_head: hidden must end in hidden_size ", config_.hidden_size, ", got ",
               hidden.defined() ? shape_str(hidden.shape()) : std::string("undefined"));
  Shape out_shape = hidden.shape();
  out_shape.back() = config_.vocab_size;
  Tensor flat = ops::reshape(hidden, {hidden.numel() / config_.hidden_size, config_.hidden_size});
  return ops::reshape(ops::linear(flat, w), out_shape);
}

namespace {

struct Ctx {
  const ModelConfig& c;
  const std::vector<std::pair<std::string, Tensor>>& params;
  const std::map<std::string, size_t>& index;

  Tensor get(const std::string& name) const { return params[index.at(name)].second; }
  Tensor get_opt(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? Tensor() : params[it->second].second;
  }
  LayerWeights layer(int64_t l) const {
    const std::string p = layer_prefix(l);
    LayerWeights w;
    w.in_norm = get(p + "input_layernorm.weight");
    w.q = get(p + "self_attn.q_proj.weight");
    w.q_b = get_opt(p + "self_attn.q_proj.bias");
    w.k = get(p + "self_attn.k_proj.weight");
    w.k_b = get_opt(p + "self_attn.k_proj.bias");
    w.v = get(p + "self_attn.v_proj.weight");
    w.v_b = get_opt(p + "self_attn.v_proj.bias");
    w.o = get(p + "self_attn.o_proj.weight");
    w.o_b = get_opt(p + "self_attn.o_proj.bias");
    w.post_norm = get(p + "post_attention_layernorm.weight");
    w.gate = get(p + "mlp.gate_proj.weight");
    w.up = get(p + "mlp.up_proj.weight");
    w.down = get(p + "mlp.down_proj.weight");
    return w;
  }
  float eps() const { return static_cast<float>(c.rms_norm_eps); }
  float theta() const { return static_cast<float>(c.rope_theta); }

  // x [N, H] -> x + down(swiglu(gate(h), up(h))), h = post_norm(x).
  Tensor mlp_block(const Tensor& x, const LayerWeights& w) const {
    Tensor h = ops::rms_norm(x, w.post_norm, eps());
    Tensor m = ops::swiglu(ops::linear(h, w.gate), ops::linear(h, w.up));
    return ops::add(x, ops::linear(m, w.down));
  }

  // [B*T, heads*D] -> [B, heads, T, D]
  Tensor split_heads(const Tensor& x, int64_t B, int64_t T, int64_t heads) const {
    return ops::transpose(ops::reshape(x, {B, T, heads, c.head_dim}), 1, 2);
  }
  // [B, heads, T, D] -> [B*T, heads*D]
  Tensor merge_heads(const Tensor& x, int64_t B, int64_t T) const {
    return ops::reshape(ops::transpose(x, 1, 2), {B * T, x.size(1) * c.head_dim});
  }
};

}  // namespace

Tensor Decoder::forward_hidden(const Tensor& ids) const {
  check_ids(ids, "forward");
  const int64_t B = ids.size(0), T = ids.size(1), H = config_.hidden_size;
  CORELM_CHECK(T <= config_.max_position_embeddings, ValueError, "Decoder::forward: sequence length ", T,
               " exceeds max_position_embeddings ", config_.max_position_embeddings);
  if (fast_ && !autograd::grad_mode_enabled()) {
    KVCache cache = make_cache(std::max<int64_t>(B, 1), std::max<int64_t>(T, 1));
    return forward_cached(ids, cache, all_rows(B), Logits::None);
  }
  Ctx ctx{config_, params_, index_};
  Tensor x = ops::reshape(ops::embedding(ctx.get("model.embed_tokens.weight"), ids), {B * T, H});
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const LayerWeights w = ctx.layer(l);
    Tensor h = ops::rms_norm(x, w.in_norm, ctx.eps());
    Tensor q = ops::rope(ctx.split_heads(ops::linear(h, w.q, w.q_b), B, T, config_.num_attention_heads), ctx.theta());
    Tensor k = ops::rope(ctx.split_heads(ops::linear(h, w.k, w.k_b), B, T, config_.num_key_value_heads), ctx.theta());
    Tensor v = ctx.split_heads(ops::linear(h, w.v, w.v_b), B, T, config_.num_key_value_heads);
    Tensor a = ctx.merge_heads(ops::causal_attention(q, k, v), B, T);
    x = ops::add(x, ops::linear(a, w.o, w.o_b));
    x = ctx.mlp_block(x, w);
  }
  x = ops::rms_norm(x, ctx.get("model.norm.weight"), ctx.eps());
  return ops::reshape(x, {B, T, H});
}

Tensor Decoder::logits_from_hidden(const Tensor& hidden) const {
  CORELM_CHECK(hidden.defined() && hidden.dim() >= 1 && hidden.size(-1) == config_.hidden_size, ShapeError,
               "Decoder::logits_from_hidden: hidden must end in hidden_size ", config_.hidden_size, ", got ",
               hidden.defined() ? shape_str(hidden.shape()) : std::string("undefined"));
  autograd::NoGradGuard no_grad;
  if (!fast_) return lm_head(hidden);
  CORELM_CHECK(hidden.dtype() == DType::F32, DTypeError, "Decoder::logits_from_hidden: hidden must be f32, got ",
               dtype_name(hidden.dtype()));
  Tensor h = hidden.contiguous();
  Shape out_shape = hidden.shape();
  out_shape.back() = config_.vocab_size;
  Tensor out = Tensor::empty(out_shape);
  fast_lm_head(*fast_, h.data<float>(), h.numel() / config_.hidden_size, out.data<float>());
  return out;
}

std::vector<int64_t> Decoder::forward_cached_argmax(const Tensor& ids, KVCache& cache, const std::vector<int64_t>& rows,
                                                    int64_t vocab_limit) const {
  const int64_t V = config_.vocab_size, H = config_.hidden_size;
  const int64_t limit = vocab_limit <= 0 || vocab_limit > V ? V : vocab_limit;
  if (!fast_) {
    const Tensor logits = forward_cached(ids, cache, rows, Logits::Last).contiguous();
    const int64_t B = logits.size(0);
    std::vector<int64_t> out(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const float* row = logits.data<float>() + b * V;
      int64_t best = 0;
      for (int64_t j = 1; j < limit; ++j)
        if (row[j] > row[best]) best = j;
      out[static_cast<size_t>(b)] = best;
    }
    return out;
  }
  CORELM_CHECK(!ids.defined() || ids.dim() != 2 || ids.size(1) > 0, ValueError,
               "Decoder::forward_cached_argmax: needs at least one token per row");
  // The final-normed hidden states are row-local, so each row's last position holds the bits
  // Logits::Last would feed the LM head.
  const Tensor hidden = forward_cached(ids, cache, rows, Logits::None).contiguous();
  const int64_t B = hidden.size(0), T = hidden.size(1);
  std::vector<float> last(static_cast<size_t>(B * H));
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(hidden.data<float>() + (b * T + T - 1) * H, H, last.data() + b * H);
  std::vector<int64_t> out(static_cast<size_t>(B));
  fast_lm_head_argmax(*fast_, last.data(), B, out.data(), limit);
  return out;
}

Tensor Decoder::forward_cached(const Tensor& ids, KVCache& cache, const std::vector<int64_t>& rows,
                               Logits logits) const {
  check_ids(ids, "forward_cached");
  autograd::NoGradGuard no_grad;
  const int64_t B = ids.size(0), T = ids.size(1), H = config_.hidden_size;
  const int64_t Hq = config_.num_attention_heads, Hkv = config_.num_key_value_heads, D = config_.head_dim;
  CORELM_CHECK(static_cast<int64_t>(rows.size()) == B, ValueError, "Decoder::forward_cached: ", rows.size(),
               " cache rows given for a batch of ", B);
  CORELM_CHECK(cache.layers() >= config_.num_hidden_layers, ValueError,
               "Decoder::forward_cached: the cache has fewer layers than the model's ", config_.num_hidden_layers);
  std::set<int64_t> distinct;
  std::vector<int64_t> start(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = rows[static_cast<size_t>(b)];
    CORELM_CHECK(r >= 0 && r < cache.batch(), IndexError, "Decoder::forward_cached: cache row ", r,
                 " out of range for a cache of ", cache.batch(), " rows");
    CORELM_CHECK(distinct.insert(r).second, ValueError, "Decoder::forward_cached: cache row ", r, " given twice");
    start[static_cast<size_t>(b)] = cache.length(r);
    CORELM_CHECK(cache.length(r) + T <= cache.capacity(), ValueError, "Decoder::forward_cached: row ", r, " holds ",
                 cache.length(r), " tokens; appending ", T, " exceeds the cache capacity ", cache.capacity());
  }
  if (T == 0) {
    CORELM_CHECK(logits != Logits::Last, ValueError, "Decoder::forward_cached: Logits::Last needs at least one token");
    return Tensor::zeros({B, 0, logits == Logits::None ? H : config_.vocab_size});
  }
  CORELM_CHECK(cache.kv_heads() == Hkv && cache.head_dim() == D, ShapeError, "Decoder::forward_cached: cache of ",
               cache.kv_heads(), " kv heads of dim ", cache.head_dim(), " does not match ", Hkv, " kv heads of dim ", D);
  if (fast_) {
    Tensor out = fast_forward_cached(*fast_, config_, ids, cache, rows, start, logits);
    for (int64_t b = 0; b < B; ++b) cache.set_length(rows[static_cast<size_t>(b)], start[static_cast<size_t>(b)] + T);
    return out;
  }

  Ctx ctx{config_, params_, index_};
  Tensor x = ops::reshape(ops::embedding(ctx.get("model.embed_tokens.weight"), ids), {B * T, H});
  std::vector<Tensor> row_out(static_cast<size_t>(B));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const LayerWeights w = ctx.layer(l);
    // The projections run batched over all rows; only attention needs each row's own history.
    Tensor h = ops::rms_norm(x, w.in_norm, ctx.eps());
    Tensor q = ops::linear(h, w.q, w.q_b);
    Tensor k = ops::linear(h, w.k, w.k_b);
    Tensor v = ops::linear(h, w.v, w.v_b);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = rows[static_cast<size_t>(b)], s0 = start[static_cast<size_t>(b)];
      auto row_of = [&](const Tensor& t, int64_t heads) {
        return ctx.split_heads(t.slice(0, b * T, (b + 1) * T), 1, T, heads);
      };
      Tensor qb = ops::rope(row_of(q, Hq), ctx.theta(), s0);
      Tensor kb = ops::rope(row_of(k, Hkv), ctx.theta(), s0);
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
      row_out[static_cast<size_t>(b)] = ctx.merge_heads(ops::causal_attention(qb, keys, values), 1, T);
    }
    Tensor a = B == 1 ? row_out[0] : ops::concat(row_out, 0);
    x = ops::add(x, ops::linear(a, w.o, w.o_b));
    x = ctx.mlp_block(x, w);
  }
  x = ops::rms_norm(x, ctx.get("model.norm.weight"), ctx.eps());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = rows[static_cast<size_t>(b)];
    cache.set_length(r, start[static_cast<size_t>(b)] + T);
  }
  Tensor hidden = ops::reshape(x, {B, T, H});
  if (logits == Logits::None) return hidden;
  if (logits == Logits::Last) hidden = hidden.slice(1, T - 1, T);
  return lm_head(hidden);
}

}  // namespace corelm::model
