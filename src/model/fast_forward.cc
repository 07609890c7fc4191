// Packing a Decoder for an inference backend: each layer's blocks pack their own weights
// (blocks/*.cc); the model-level pieces (final norm, LM head, embedding, RoPE) are packed here.
#include "model/fast_forward.h"

#include <map>

#include "corelm/error.h"

namespace corelm::model {
namespace {

const Tensor& tensor_of(const Decoder& d, const std::string& name) {
  for (const auto& [n, t] : d.named_parameters())
    if (n == name) {
      CORELM_CHECK(t.is_contiguous() && t.dtype() == DType::F32, DTypeError, "pack_fast_weights: parameter '", name,
                   "' must be contiguous f32");
      return t;
    }
  throw IndexError("pack_fast_weights: no parameter '" + name + "'");
}

ops::WeightFormat format_of(Precision p) {
  return p == Precision::Int8 ? ops::WeightFormat::Int8 : p == Precision::Q4 ? ops::WeightFormat::Q4 : ops::WeightFormat::BF16;
}

// Q4 keeps the LM head in int8: on stories260K (docs/KERNELS.md) a 4-bit head raised perplexity
// from +7.6% to +9.8% over f32 (first 200 paragraphs), a fifth of the whole q4 cost for one linear
// of many; the logits feed sampling directly, with no later layer to average the error out.
Precision lm_head_precision(Precision p) { return p == Precision::Q4 ? Precision::Int8 : p; }

}  // namespace

FastWeights pack_fast_weights(const Decoder& d, Precision precision) {
  CORELM_CHECK(precision == Precision::BF16 || precision == Precision::Int8 || precision == Precision::Q4, ValueError,
               "pack_fast_weights: the fast path packs bf16, int8 or q4, not ", precision_name(precision));
  const ModelConfig& c = d.config();
  const int64_t H = c.hidden_size;
  const ops::InferenceBackend& be = ops::cpu_backend();
  blocks::LayerParams::Index index;
  const auto& params = d.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) index[params[i].first] = i;
  FastWeights w;
  w.backend = &be;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const blocks::LayerParams p(params, index, l);
    const blocks::LayerBlocks kinds = blocks::layer_blocks(c, l);
    FastLayer layer;
    layer.mixer = kinds.mixer->pack(c, p, be, format_of(precision));
    layer.ffn = kinds.ffn->pack(c, p, be, format_of(precision));
    w.layers.push_back(std::move(layer));
  }
  w.final_norm = be.pack_vector(tensor_of(d, "model.norm.weight").data<float>(), H);
  const Tensor& head = tensor_of(d, d.lm_head_weight_name());
  w.lm_head = be.pack_head(head.data<float>(), head.size(0), H, format_of(lm_head_precision(precision)));
  w.embed = tensor_of(d, "model.embed_tokens.weight");
  // Caches may be longer than max_position_embeddings (the reference path allows it too): the
  // table grows with the positions used.
  w.rope = be.make_rope_tables(c.head_dim, static_cast<float>(c.rope_theta));
  return w;
}

void fast_lm_head(const FastWeights& w, const float* hidden, int64_t n, float* logits) {
  w.backend->lm_head(*w.lm_head, hidden, n, logits);
}

void fast_lm_head_argmax(const FastWeights& w, const float* hidden, int64_t n, int64_t* ids, int64_t limit) {
  w.backend->lm_head_argmax(*w.lm_head, hidden, n, ids, limit);
}

}  // namespace corelm::model
