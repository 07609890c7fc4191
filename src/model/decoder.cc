// Decoder: the layer loop. Embedding -> per layer: its mixer block, then its FFN block
// (blocks/layer_blocks.cc says which kinds) -> final RMSNorm -> LM head, in three forms: the
// training forward on the differentiable ops (autograd gives the backward), the reference
// incremental forward (the same ops under NoGradGuard, attention per row against its cache), and
// the inference forward against the packed weights of an inference backend (fast_forward.h).
#include <algorithm>
#include <set>
#include <stdexcept>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/ops.h"
#include "corelm/random.h"
#include "model/blocks/block.h"
#include "model/blocks/linear_attention.h"
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

// bos_isolation's document index: the running count of BOS tokens along each row (a BOS opens a
// new document; tokens before the first BOS are document 0), i64 [B, T].
Tensor bos_doc_ids(const Tensor& ids, int64_t bos) {
  const int64_t B = ids.size(0), T = ids.size(1);
  const std::vector<int64_t> tok = ids.to_int_vector();
  Tensor out = Tensor::empty({B, T}, DType::I64);
  int64_t* d = out.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t doc = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (tok[static_cast<size_t>(b * T + t)] == bos) ++doc;
      d[b * T + t] = doc;
    }
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Shape>> parameter_shapes(const ModelConfig& config) {
  const int64_t H = config.hidden_size, V = config.vocab_size;
  std::vector<std::pair<std::string, Shape>> out;
  // Same order as HF's named_parameters(): each layer's projections (mixer, then FFN), then its
  // norms.
  out.emplace_back("model.embed_tokens.weight", Shape{V, H});
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    const blocks::LayerBlocks kinds = blocks::layer_blocks(config, l);
    blocks::ShapeList norms;
    kinds.mixer->parameter_shapes(config, l, p, out, norms);
    kinds.ffn->parameter_shapes(config, l, p, out, norms);
    out.insert(out.end(), norms.begin(), norms.end());
  }
  out.emplace_back("model.norm.weight", Shape{H});
  if (!config.tie_word_embeddings) out.emplace_back("lm_head.weight", Shape{V, H});
  if (config.has_classifier()) out.emplace_back("score.weight", Shape{static_cast<int64_t>(config.labels.size()), H});
  return out;
}

Decoder::Decoder(ModelConfig config) : config_(std::move(config)) {
  if (config_.head_dim == 0) {
    config_.validate();  // names the failing field, e.g. heads not dividing hidden_size
    config_.head_dim = config_.hidden_size / config_.num_attention_heads;
  }
  config_.validate();
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
    } else if (ends_with(name, "self_attn.decay")) {
      // Deterministic (docs/HYBRID.md): the channels' half-lives spread geometrically.
      const std::vector<float> row = blocks::linear_attention_decay_init(t.size(1));
      Tensor w = Tensor::empty(t.shape());
      for (int64_t g = 0; g < t.size(0); ++g) std::copy(row.begin(), row.end(), w.data<float>() + g * t.size(1));
      t.copy_(w);
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

Tensor Decoder::forward_hidden(const Tensor& ids) const {
  check_ids(ids, "forward");
  const int64_t B = ids.size(0), T = ids.size(1), H = config_.hidden_size;
  CORELM_CHECK(T <= config_.max_position_embeddings, ValueError, "Decoder::forward: sequence length ", T,
               " exceeds max_position_embeddings ", config_.max_position_embeddings);
  if (fast_ && !autograd::grad_mode_enabled()) {
    KVCache cache = make_cache(std::max<int64_t>(B, 1), std::max<int64_t>(T, 1));
    return forward_cached(ids, cache, all_rows(B), Logits::None);
  }
  auto param = [&](const std::string& name) -> const Tensor& { return params_[index_.at(name)].second; };
  Tensor x = ops::reshape(ops::embedding(param("model.embed_tokens.weight"), ids), {B * T, H});
  blocks::ForwardContext ctx{B, T, 0, Tensor()};
  if (config_.bos_isolation) ctx.doc_ids = bos_doc_ids(ids, config_.bos_token_id);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const blocks::LayerParams p(params_, index_, l);
    const blocks::LayerBlocks kinds = blocks::layer_blocks(config_, l);
    ctx.layer = l;
    x = kinds.mixer->forward(config_, p, x, ctx);
    x = kinds.ffn->forward(config_, p, x, ctx);
  }
  x = ops::rms_norm(x, param("model.norm.weight"), static_cast<float>(config_.rms_norm_eps));
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

namespace {

// The inference forward over packed weights: ids [B, T] (validated by the caller) appended at
// start[b] of cache row rows[b]; does not touch the cache lengths. The residual stream and every
// intermediate live in the backend's per-thread scratch, which only grows, so steady-state
// decoding allocates nothing but the returned tensor. Every block op is row-local or reduces in a
// fixed order, so a row's outputs never depend on the rest of the batch or the threads.
Tensor forward_packed(const FastWeights& w, const ModelConfig& c, const Tensor& ids, KVCache& cache,
                      const std::vector<int64_t>& rows, const std::vector<int64_t>& start, Logits logits) {
  const ops::InferenceBackend& be = *w.backend;
  const int64_t B = ids.size(0), T = ids.size(1), N = B * T, H = c.hidden_size, V = c.vocab_size;
  const std::vector<int64_t> tokens = ids.to_int_vector();
  for (int64_t i = 0; i < N; ++i) {
    const int64_t id = tokens[static_cast<size_t>(i)];
    CORELM_CHECK(id >= 0 && id < V, IndexError, "Decoder::forward_cached: token id ", id, " at [", i / T, ", ",
                 i % T, "] is outside the vocabulary (", V, ")");
  }
  float* x = be.scratch(ops::Scratch::X, N * H);
  be.gather_rows(w.embed.data<float>(), H, tokens.data(), N, x);

  int64_t end = 0;  // one past the last position this call writes
  for (int64_t b = 0; b < B; ++b) end = std::max(end, start[static_cast<size_t>(b)] + T);
  const std::shared_ptr<const ops::RopeTable> rope = w.rope->at_least(end);
  blocks::InferenceStep step{be, c, x, ops::TokenLayout{B, T, 0, start.data(), rows.data()}, cache, *rope};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const blocks::LayerBlocks kinds = blocks::layer_blocks(c, l);
    const FastLayer& packed = w.layers[static_cast<size_t>(l)];
    step.layer = l;
    // With Logits::Last, the last layer's work after its cache writes is needed only for each
    // row's last token (the mixer narrows the step to those rows).
    step.last_only = l == c.num_hidden_layers - 1 && logits == Logits::Last && T > 1;
    kinds.mixer->infer(*packed.mixer, step);
    kinds.ffn->infer(*packed.ffn, step);
  }

  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t n = step.layout.tokens();  // B with Logits::Last: x holds each row's last token
  float* h = be.scratch(ops::Scratch::Hidden, N * H);
  be.rms_norm(x, H, *w.final_norm, h, H, n, eps);
  if (logits == Logits::Last) {
    Tensor out = Tensor::empty({B, 1, V});
    be.lm_head(*w.lm_head, h, B, out.data<float>());
    return out;
  }
  if (logits == Logits::None) {
    Tensor out = Tensor::empty({B, T, H});
    be.copy(out.data<float>(), h, N * H);
    return out;
  }
  Tensor out = Tensor::empty({B, T, V});
  be.lm_head(*w.lm_head, h, N, out.data<float>());
  return out;
}

}  // namespace

Tensor Decoder::forward_cached(const Tensor& ids, KVCache& cache, const std::vector<int64_t>& rows,
                               Logits logits) const {
  check_ids(ids, "forward_cached");
  autograd::NoGradGuard no_grad;
  const int64_t B = ids.size(0), T = ids.size(1), H = config_.hidden_size;
  const int64_t Hkv = config_.num_key_value_heads, D = config_.head_dim;
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
    Tensor out = forward_packed(*fast_, config_, ids, cache, rows, start, logits);
    for (int64_t b = 0; b < B; ++b) cache.set_length(rows[static_cast<size_t>(b)], start[static_cast<size_t>(b)] + T);
    return out;
  }

  auto param = [&](const std::string& name) -> const Tensor& { return params_[index_.at(name)].second; };
  Tensor x = ops::reshape(ops::embedding(param("model.embed_tokens.weight"), ids), {B * T, H});
  const blocks::CachedRows at{B, T, rows, start};
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const blocks::LayerParams p(params_, index_, l);
    const blocks::LayerBlocks kinds = blocks::layer_blocks(config_, l);
    x = kinds.mixer->forward_cached(config_, p, x, cache, l, at);
    x = kinds.ffn->forward_cached(config_, p, x, cache, l, at);
  }
  x = ops::rms_norm(x, param("model.norm.weight"), static_cast<float>(config_.rms_norm_eps));
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
