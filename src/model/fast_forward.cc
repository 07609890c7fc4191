// Fast inference forward. Per layer: fused RMSNorm -> one QKV linear -> RoPE on q/k in place and
// k/v written into the cache -> online-softmax attention against each row's cache -> o linear ->
// residual -> RMSNorm -> one gate+up linear -> SwiGLU -> down -> residual. Buffers come from a
// per-thread workspace that only grows, so steady-state decoding allocates nothing but the
// returned tensor. Every step is row-local or reduces in a fixed order (and the bf16, int8 and q4
// linears are batch invariant), so a row's outputs never depend on the rest of the batch or the
// threads.
#include "model/fast_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "corelm/error.h"
#include "corelm/thread_pool.h"

namespace corelm::model {
namespace {

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

const Tensor& tensor_of(const Decoder& d, const std::string& name) {
  for (const auto& [n, t] : d.named_parameters())
    if (n == name) {
      CORELM_CHECK(t.is_contiguous() && t.dtype() == DType::F32, DTypeError, "pack_fast_weights: parameter '", name,
                   "' must be contiguous f32");
      return t;
    }
  throw IndexError("pack_fast_weights: no parameter '" + name + "'");
}

const float* param(const Decoder& d, const std::string& name) { return tensor_of(d, name).data<float>(); }

std::vector<float> copy_of(const Decoder& d, const std::string& name, int64_t n) {
  const float* p = param(d, name);
  return std::vector<float>(p, p + n);
}

// W [n, k] contiguous packed for `precision` (BF16, Int8 or Q4; bias may be null).
FastLinear pack_linear(const float* W, int64_t n, int64_t k, const float* bias, Precision precision) {
  FastLinear out;
  switch (precision) {
    case Precision::Int8:
      out.kind = FastLinear::Kind::Int8;
      out.i8 = kernels::pack_linear_int8(W, n, k, k, bias);
      break;
    case Precision::Q4:
      out.kind = FastLinear::Kind::Q4;
      out.q4 = kernels::pack_linear_q4(W, n, k, k, bias, kernels::preferred_q4_format());
      break;
    default:
      out.kind = FastLinear::Kind::BF16;
      out.bf16 = kernels::pack_linear_bf16(W, n, k, k, bias, kernels::preferred_linear_bf16_kernel());
  }
  return out;
}

// Packs the row-concatenation of several [rows_i, k] weights (and their biases, if any) as one linear.
// Int8 scales are per output row and q4 scales per 32 inputs of one row, so fusing rows changes no scale.
FastLinear pack_rows(const Decoder& d, const std::vector<std::string>& names, int64_t k, Precision precision) {
  std::vector<float> w, bias;
  bool any_bias = false;
  for (const auto& name : names) any_bias |= d.has_parameter(name + ".bias");
  for (const auto& name : names) {
    const int64_t rows = tensor_of(d, name + ".weight").size(0);
    const float* p = param(d, name + ".weight");
    w.insert(w.end(), p, p + rows * k);
    if (d.has_parameter(name + ".bias")) {
      const float* b = param(d, name + ".bias");
      bias.insert(bias.end(), b, b + rows);
    } else if (any_bias) {
      bias.insert(bias.end(), static_cast<size_t>(rows), 0.0f);
    }
  }
  const int64_t n = static_cast<int64_t>(w.size()) / k;
  return pack_linear(w.data(), n, k, any_bias ? bias.data() : nullptr, precision);
}

// The LM head (no bias) in blocks of kLmHeadBlock rows. Int8 and q4 scales are per output row (q4:
// per 32 inputs of it) and bf16 rounds each weight alone, so a block packs exactly the rows the
// whole matrix would.
std::vector<FastLinear> pack_lm_head(const Decoder& d, const std::string& name, int64_t k, Precision precision) {
  const Tensor& t = tensor_of(d, name);
  const float* p = t.data<float>();
  const int64_t V = t.size(0);
  std::vector<FastLinear> blocks;
  for (int64_t r0 = 0; r0 < V; r0 += kLmHeadBlock)
    blocks.push_back(pack_linear(p + r0 * k, std::min(kLmHeadBlock, V - r0), k, nullptr, precision));
  return blocks;
}

// Q4 keeps the LM head in int8: on stories260K (docs/KERNELS.md) a 4-bit head raised perplexity
// from +7.6% to +9.8% over f32 (first 200 paragraphs), a fifth of the whole q4 cost for one linear
// of many; the logits feed sampling directly, with no later layer to average the error out.
Precision lm_head_precision(Precision p) { return p == Precision::Q4 ? Precision::Int8 : p; }

// Reused buffers; sized up on demand, never shrunk.
struct Workspace {
  std::vector<float> x, h, qkv, attn, gu, m, tmp;
  static float* fit(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
  }
};

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

FastWeights pack_fast_weights(const Decoder& d, Precision precision) {
  CORELM_CHECK(precision == Precision::BF16 || precision == Precision::Int8 || precision == Precision::Q4, ValueError,
               "pack_fast_weights: the fast path packs bf16, int8 or q4, not ", precision_name(precision));
  const ModelConfig& c = d.config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim();
  FastWeights w;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    FastLayer layer;
    layer.in_norm = copy_of(d, p + "input_layernorm.weight", H);
    layer.post_norm = copy_of(d, p + "post_attention_layernorm.weight", H);
    layer.qkv = pack_rows(d, {p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"}, H, precision);
    layer.o = pack_rows(d, {p + "self_attn.o_proj"}, Q, precision);
    layer.gate_up = pack_rows(d, {p + "mlp.gate_proj", p + "mlp.up_proj"}, H, precision);
    layer.down = pack_rows(d, {p + "mlp.down_proj"}, I, precision);
    w.layers.push_back(std::move(layer));
  }
  w.final_norm = copy_of(d, "model.norm.weight", H);
  w.lm_head = pack_lm_head(d, d.lm_head_weight_name(), H, lm_head_precision(precision));
  w.embed = tensor_of(d, "model.embed_tokens.weight");
  // Caches may be longer than max_position_embeddings (the reference path allows it too): the
  // table grows with the positions used.
  w.rope = std::make_unique<RopeTables>(c.head_dim, static_cast<float>(c.rope_theta));
  return w;
}

void fast_lm_head(const FastWeights& w, const float* hidden, int64_t n, float* logits) {
  int64_t V = 0;
  for (const FastLinear& b : w.lm_head) V += b.n();
  int64_t col = 0;
  for (const FastLinear& b : w.lm_head) {
    b.run(hidden, n, b.k(), logits + col, V);
    col += b.n();
  }
}

void fast_lm_head_argmax(const FastWeights& w, const float* hidden, int64_t n, int64_t* ids, int64_t limit) {
  if (n <= 0) return;
  int64_t V = 0;
  for (const FastLinear& b : w.lm_head) V += b.n();
  if (limit <= 0 || limit > V) limit = V;
  thread_local std::vector<float> buffer;
  float* y = Workspace::fit(buffer, n * kLmHeadBlock);
  thread_local std::vector<float> best_value;
  float* best = Workspace::fit(best_value, n);
  // The running scan visits columns in order with `>`, as a plain argmax over the row does: the
  // first index wins ties, and a NaN neither wins nor (after column 0) is chosen.
  int64_t col = 0;
  for (const FastLinear& b : w.lm_head) {
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

std::shared_ptr<const kernels::RopeTable> RopeTables::at_least(int64_t positions) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!table_ || table_->max_positions < positions) {
    // Doubling keeps a decode that advances one position per step from rebuilding each step.
    const int64_t have = table_ ? table_->max_positions : 0;
    const int64_t n = std::max<int64_t>({positions, 2 * have, 8192});
    table_ = std::make_shared<const kernels::RopeTable>(head_dim_, n, theta_);
  }
  return table_;
}

Tensor fast_forward_cached(const FastWeights& w, const ModelConfig& c, const Tensor& ids, KVCache& cache,
                           const std::vector<int64_t>& rows, const std::vector<int64_t>& start, Logits logits) {
  const int64_t B = ids.size(0), T = ids.size(1), N = B * T;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, Q = c.q_dim(), KV = c.kv_dim();
  const int64_t QKV = Q + 2 * KV, cap = cache.capacity();
  thread_local Workspace ws;
  float* x = Workspace::fit(ws.x, N * H);
  float* h = Workspace::fit(ws.h, N * H);
  float* qkv = Workspace::fit(ws.qkv, N * QKV);
  float* attn = Workspace::fit(ws.attn, N * Q);
  float* gu = Workspace::fit(ws.gu, N * 2 * I);
  float* m = Workspace::fit(ws.m, N * I);
  float* tmp = Workspace::fit(ws.tmp, N * H);

  const std::vector<int64_t> tokens = ids.to_int_vector();
  const float* embed = w.embed.data<float>();
  for (int64_t i = 0; i < N; ++i) {
    const int64_t id = tokens[static_cast<size_t>(i)];
    CORELM_CHECK(id >= 0 && id < V, IndexError, "Decoder::forward_cached: token id ", id, " at [", i / T, ", ",
                 i % T, "] is outside the vocabulary (", V, ")");
    std::memcpy(x + i * H, embed + id * H, static_cast<size_t>(H) * sizeof(float));
  }

  int64_t end = 0;  // one past the last position this call writes
  for (int64_t b = 0; b < B; ++b) end = std::max(end, start[static_cast<size_t>(b)] + T);
  const std::shared_ptr<const kernels::RopeTable> rope = w.rope->at_least(end);
  const kernels::CachedAttention shape{Hq, Hkv, D, cap, 1.0f / std::sqrt(static_cast<float>(D))};
  const float eps = static_cast<float>(c.rms_norm_eps);
  const kernels::QuantCacheFormats formats{static_cast<kernels::KVFormat>(static_cast<int>(cache.types().k)),
                                           static_cast<kernels::KVFormat>(static_cast<int>(cache.types().v))};
  const int64_t krb = cache.k_row_bytes(), vrb = cache.v_row_bytes();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const FastLayer& L = w.layers[static_cast<size_t>(l)];
    // f32 caches keep the f32 kernels; any other type is written encoded and read in place.
    const bool f32 = cache.types().all_f32();
    auto* kb = static_cast<uint8_t*>(cache.k_bytes(l).raw_data());
    auto* vb = static_cast<uint8_t*>(cache.v_bytes(l).raw_data());
    float* kc = f32 ? cache.k(l).data<float>() : nullptr;
    float* vc = f32 ? cache.v(l).data<float>() : nullptr;
    kernels::fused_rms_norm(x, H, L.in_norm.data(), h, H, N, H, eps);
    L.qkv.run(h, N, H, qkv, QKV);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t b = i / T, pos = start[static_cast<size_t>(b)] + i % T;
      float* row = qkv + i * QKV;
      kernels::fused_rope_inplace(row, Hq, *rope, pos);
      kernels::fused_rope_inplace(row + Q, Hkv, *rope, pos);
      const int64_t r = rows[static_cast<size_t>(b)];
      for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t at = (r * Hkv + g) * cap + pos;  // entry index
        if (f32) {
          std::memcpy(kc + at * D, row + Q + g * D, static_cast<size_t>(D) * sizeof(float));
          std::memcpy(vc + at * D, row + Q + KV + g * D, static_cast<size_t>(D) * sizeof(float));
        } else {
          kernels::kv_encode_row(formats.k, row + Q + g * D, D, kb + at * krb);
          kernels::kv_encode_row(formats.v, row + Q + KV + g * D, D, vb + at * vrb);
        }
      }
    }
    // With Logits::Last, the last layer's work after the K/V writes is needed only for each row's
    // last token: move those rows to the front (row b from b*T + T - 1, never overwriting a row
    // still to be moved) and finish the layer on B rows.
    int64_t n = N, t_kept = T;
    if (l == c.num_hidden_layers - 1 && logits == Logits::Last && T > 1) {
      for (int64_t b = 0; b < B; ++b) {
        std::memcpy(qkv + b * QKV, qkv + (b * T + T - 1) * QKV, static_cast<size_t>(Q) * sizeof(float));
        std::memcpy(x + b * H, x + (b * T + T - 1) * H, static_cast<size_t>(H) * sizeof(float));
      }
      n = B;
      t_kept = 1;
    }
    // One work item per (token, query head); each writes only its own output slice. Few items
    // (decoding one row) go one per chunk so a second thread still gets heads to do.
    parallel_for(n * Hq, n * Hq >= 64 ? 4 : 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / Hq, head = item % Hq, b = i / t_kept;
        const int64_t r = rows[static_cast<size_t>(b)];
        const int64_t pos = start[static_cast<size_t>(b)] + T - t_kept + i % t_kept;
        if (f32) {
          const int64_t row_base = r * Hkv * cap * D;
          kernels::fused_attention_head(qkv + i * QKV + head * D, kc + row_base, vc + row_base,
                                        attn + i * Q + head * D, head, pos, shape);
        } else {
          kernels::quant_attention_head(qkv + i * QKV + head * D, kb + r * Hkv * cap * krb, vb + r * Hkv * cap * vrb,
                                        attn + i * Q + head * D, head, pos, shape, formats);
        }
      }
    });
    L.o.run(attn, n, Q, tmp, H);
    add_inplace(x, tmp, n * H);
    kernels::fused_rms_norm(x, H, L.post_norm.data(), h, H, n, H, eps);
    L.gate_up.run(h, n, H, gu, 2 * I);
    kernels::fused_swiglu(gu, 2 * I, m, I, n, I);
    L.down.run(m, n, I, tmp, H);
    add_inplace(x, tmp, n * H);
  }

  if (logits == Logits::Last) {  // x holds each row's last token in rows 0 .. B-1
    kernels::fused_rms_norm(x, H, w.final_norm.data(), h, H, B, H, eps);
    Tensor out = Tensor::empty({B, 1, V});
    fast_lm_head(w, h, B, out.data<float>());
    return out;
  }
  kernels::fused_rms_norm(x, H, w.final_norm.data(), h, H, N, H, eps);
  if (logits == Logits::None) {
    Tensor out = Tensor::empty({B, T, H});
    std::memcpy(out.data<float>(), h, static_cast<size_t>(N * H) * sizeof(float));
    return out;
  }
  Tensor out = Tensor::empty({B, T, V});
  fast_lm_head(w, h, N, out.data<float>());
  return out;
}

}  // namespace corelm::model
