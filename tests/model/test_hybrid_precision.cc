// Where the hybrid's bf16 fast-path error comes from (docs/HYBRID.md, "bf16 fast-path error"):
// models of one layer kind, cut after L layers, the fast path (bf16) and the f32 forward with only
// the projection weights rounded to bf16, each against the f32 forward. The linear-attention
// layers carry the error, the f32 forward with rounded weights shows as much of it as the fast
// path, and within a linear layer it is q_proj's rounding, magnified by the per-head norm at the
// positions whose attention output is small. Numbers are printed for the docs; the assertions
// hold the conclusions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/model.h"
#include "corelm/ops.h"
#include "corelm/random.h"

namespace corelm::model {
namespace {

const LayerSpec kLin{AttentionKind::Linear, 0, 6, FfnKind::Dense};
LayerSpec swa(int64_t w) { return LayerSpec{AttentionKind::Sliding, w, 0, FfnKind::Dense}; }

ModelConfig base(std::vector<LayerSpec> layers) {
  ModelConfig c;
  c.vocab_size = 37;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  c.initializer_range = 0.08;
  c.bos_token_id = 1;
  c.num_hidden_layers = static_cast<int64_t>(layers.size());
  c.layers = std::move(layers);
  return c;
}

Tensor random_ids(int64_t T, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> v(static_cast<size_t>(T));
  for (auto& x : v) x = 2 + static_cast<int64_t>(g.below(static_cast<uint64_t>(vocab - 2)));
  return Tensor::from_vector(v, {1, T});
}

double max_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - ref[i]))), m = std::max(m, double(std::abs(ref[i])));
  return m > 0 ? d / m : d;
}

// The first L layers of `full` (same weights), optionally with the projection weights rounded to
// bf16 (what the fast path's packing does to them; activations stay f32).
Decoder truncated(const Decoder& full, int64_t L, bool round_weights, const std::string& only = "proj.weight") {
  ModelConfig c = full.config();
  c.num_hidden_layers = L;
  c.layers.resize(static_cast<size_t>(L));
  Decoder m(c);
  for (const auto& [name, t] : m.named_parameters()) {
    for (const auto& [n2, src] : full.named_parameters()) {
      if (n2 != name) continue;
      const bool proj = name.find(only) != std::string::npos;
      m.load_parameter(name, round_weights && proj ? src.to(DType::BF16).to(DType::F32) : src);
    }
  }
  return m;
}

struct Errors {
  double fast_vs_f32, rounded_vs_f32, fast_vs_rounded;
};

Errors errors(const Decoder& full, int64_t L, const Tensor& ids) {
  Decoder ref = truncated(full, L, false), rounded = truncated(full, L, true), fast = truncated(full, L, false);
  const std::vector<float> r = ref.forward(ids).to_float_vector(), w = rounded.forward(ids).to_float_vector();
  fast.prepare_inference(Precision::BF16);
  autograd::NoGradGuard no_grad;
  KVCache cache = fast.make_cache(1, ids.size(1));
  const std::vector<float> f = fast.forward_cached(ids, cache, {0}).to_float_vector();
  return {max_rel(f, r), max_rel(w, r), max_rel(f, w)};
}

TEST(HybridPrecision, ErrorByLayer) {
  const Tensor ids = random_ids(150, 37, 12);
  std::vector<double> rounded_l1;  // per kind, after one layer
  for (const auto& [name, layers] :
       {std::pair<std::string, std::vector<LayerSpec>>{"hybrid", {kLin, swa(8), LayerSpec{}, kLin, swa(8)}},
        {"linear", {kLin, kLin, kLin, kLin, kLin}},
        {"sliding", {swa(8), swa(8), swa(8), swa(8), swa(8)}},
        {"full", {LayerSpec{}, LayerSpec{}, LayerSpec{}, LayerSpec{}, LayerSpec{}}}}) {
    Decoder m(base(layers));
    m.init_weights(31);
    for (int64_t L = 1; L <= 5; ++L) {
      const Errors e = errors(m, L, ids);
      std::printf("%-8s L %lld: fast bf16 vs f32 %.2e | f32 with bf16-rounded weights vs f32 %.2e | fast vs rounded-weight f32 %.2e\n",
                  name.c_str(), (long long)L, e.fast_vs_f32, e.rounded_vs_f32, e.fast_vs_rounded);
      if (L == 1) rounded_l1.push_back(e.rounded_vs_f32);
      // The fast path's own rounding (activations to bf16 inside its linears, its summation
      // order) adds no more than what rounding the weights alone causes in the f32 forward
      // (measured ratio at most 1.5, hybrid at 5 layers 0.88).
      if (name == "hybrid" || name == "linear") {
        EXPECT_LE(e.fast_vs_f32, 2.0 * e.rounded_vs_f32) << name << " L " << L;
      }
    }
  }
  // One linear-attention layer is far more sensitive to bf16 weights than one softmax-attention
  // layer (measured 1.36e-2 vs 1.55e-3 and 1.54e-3).
  EXPECT_GT(rounded_l1[1], 4.0 * rounded_l1[2]);
  EXPECT_GT(rounded_l1[1], 4.0 * rounded_l1[3]);
}

// The same at the hybrid preset's widths (hidden 256, head_dim 32, d_state 32, FFN 640), a small
// vocabulary so that the test stays fast: is the effect an artefact of the tests' tiny d_state?
TEST(HybridPrecision, AtThePresetsWidths) {
  const Tensor ids = random_ids(150, 37, 12);
  ModelConfig c = base({});
  c.hidden_size = 256, c.intermediate_size = 640, c.head_dim = 32, c.initializer_range = 0.02;
  for (const auto& [name, spec] : {std::pair<std::string, LayerSpec>{"linear", LayerSpec{AttentionKind::Linear, 0, 32, FfnKind::Dense}},
                                   {"sliding", swa(64)}}) {
    c.layers.assign(3, spec);
    c.num_hidden_layers = 3;
    Decoder m(c);
    m.init_weights(31);
    for (int64_t L : {1, 3}) {
      const Errors e = errors(m, L, ids);
      std::printf("preset widths, %-7s L %lld: fast bf16 vs f32 %.2e | f32 with bf16-rounded weights vs f32 %.2e\n",
                  name.c_str(), (long long)L, e.fast_vs_f32, e.rounded_vs_f32);
      EXPECT_LE(e.fast_vs_f32, 2.0 * e.rounded_vs_f32 + 2e-3) << name << " L " << L;
    }
  }
}

TEST(HybridPrecision, WhichWeights) {
  const Tensor ids = random_ids(150, 37, 12);
  Decoder m(base({kLin}));
  m.init_weights(31);
  const std::vector<float> r = truncated(m, 1, false).forward(ids).to_float_vector();
  std::vector<double> by;
  for (const char* only : {"proj.weight", "q_proj", "k_proj", "v_proj", "o_proj", "mlp", "embed"}) {
    const std::vector<float> w = truncated(m, 1, true, only).forward(ids).to_float_vector();
    by.push_back(max_rel(w, r));
    std::printf("linear L 1, only %-12s rounded to bf16: vs f32 %.2e\n", only, by.back());
  }
  // q_proj alone gives (almost) all of it (measured 1.37e-2 of 1.36e-2; k, v, o, mlp, embedding
  // 8e-4 .. 4.9e-3).
  for (size_t i = 2; i < by.size(); ++i) EXPECT_GT(by[1], 2.5 * by[i]) << i;
  EXPECT_GT(by[1], 0.8 * by[0]);
  // The linear attention's output before its per-head norm: its size against the norm's eps.
  const ModelConfig& c = m.config();
  auto P = [&](const std::string& n) {
    for (const auto& [name, t] : m.named_parameters()) if (name.find(n) != std::string::npos) return t;
    return Tensor();
  };
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor x = ops::embedding(P("embed_tokens"), ids);
  x = ops::reshape(x, {150, c.hidden_size});
  std::vector<float> normed[2], raw[2];
  for (bool rnd : {false, true}) {
    auto W = [&](const std::string& n) { return rnd ? P(n).to(DType::BF16).to(DType::F32) : P(n); };
    Tensor h = ops::rms_norm(x, P("input_layernorm"), eps);
    auto heads = [&](const Tensor& t, int64_t H, int64_t d) { return ops::transpose(ops::reshape(t, {1, 150, H, d}), 1, 2); };
    Tensor q = heads(ops::linear(h, W("q_proj")), 2, 6), k = heads(ops::linear(h, W("k_proj")), 1, 6),
           v = heads(ops::linear(h, W("v_proj")), 1, 8);
    Tensor o = ops::linear_attention(q, k, v, ops::neg(ops::exp(P("self_attn.decay"))), Tensor(), Tensor(), nullptr,
                                     1.0f / std::sqrt(6.0f));
    const std::vector<float> ov = o.contiguous().to_float_vector();
    raw[rnd] = ov;
    normed[rnd] = ops::rms_norm(o, P("out_norm"), eps).contiguous().to_float_vector();
    double ss = 0, vmax = 0;
    for (float f : ov) ss += double(f) * f;
    for (float f : v.contiguous().to_float_vector()) vmax = std::max(vmax, double(std::abs(f)));
    std::printf("rounded %d: rms(o) %.3e (eps %.0e, so rms(o)^2/eps = %.2e), max|v| %.3e\n", int(rnd),
                std::sqrt(ss / ov.size()), double(eps), ss / ov.size() / eps, vmax);
  }
  // Per (head, position): the error of the normed output after rounding q/k/v's weights, against
  // how small that position's o is (rms of its 8 values over the rms of all of o).
  double all = 0;
  for (float f : raw[0]) all += double(f) * f;
  all = std::sqrt(all / raw[0].size());
  struct Row { double err, rel_o, err_raw; int64_t h, t; };
  std::vector<Row> rows;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 150; ++t) {
      double e = 0, er = 0, r = 0;
      for (int64_t j = 0; j < 8; ++j) {
        const size_t i = static_cast<size_t>((h * 150 + t) * 8 + j);
        e = std::max(e, double(std::abs(normed[1][i] - normed[0][i])));
        er = std::max(er, double(std::abs(raw[1][i] - raw[0][i])));
        r += double(raw[0][i]) * raw[0][i];
      }
      rows.push_back({e, std::sqrt(r / 8) / all, er, h, t});
    }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.err > b.err; });
  for (int i = 0; i < 5; ++i)
    std::printf("worst normed-o error %.2e (raw o error %.2e) at head %lld pos %lld, where rms(o_t)/rms(o) = %.3f\n",
                rows[i].err, rows[i].err_raw, (long long)rows[i].h, (long long)rows[i].t, rows[i].rel_o);
  double med = 0;
  std::vector<double> es;
  for (const Row& r : rows) es.push_back(r.err);
  std::sort(es.begin(), es.end());
  med = es[es.size() / 2];
  std::printf("median normed-o error %.2e\n", med);
  // The worst positions are those with a small o (measured: the five worst have 0.08 .. 0.18 of
  // the typical rms and 6-7x the median error).
  for (int i = 0; i < 5; ++i) EXPECT_LT(rows[i].rel_o, 0.5) << i;
  EXPECT_GT(rows[0].err, 4.0 * med);
}

}  // namespace
}  // namespace corelm::model
