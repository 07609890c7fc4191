// The dense SwiGLU FFN: training forward on the ops (also the reference path's, having no cache)
// and the inference forward against a backend (fused RMSNorm -> one gate+up linear -> SwiGLU ->
// down -> residual).
#include "model/blocks/dense_ffn.h"

#include "corelm/ops.h"

namespace corelm::model::blocks {
namespace {

struct Packed final : PackedBlock {
  std::unique_ptr<ops::PackedVector> post_norm;
  std::unique_ptr<ops::PackedLinear> gate_up;  // [2 I, H]: gate rows, then up rows
  std::unique_ptr<ops::PackedLinear> down;     // [H, I]
};

class DenseFfn final : public Block {
 public:
  const char* kind() const override { return "dense_ffn"; }

  void parameter_shapes(const ModelConfig& c, int64_t, const std::string& p, ShapeList& proj,
                        ShapeList& norms) const override {
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    proj.emplace_back(p + "mlp.gate_proj.weight", Shape{I, H});
    proj.emplace_back(p + "mlp.up_proj.weight", Shape{I, H});
    proj.emplace_back(p + "mlp.down_proj.weight", Shape{H, I});
    norms.emplace_back(p + "post_attention_layernorm.weight", Shape{H});
  }

  Tensor forward(const ModelConfig& c, const LayerParams& p, const Tensor& x, const ForwardContext&) const override {
    Tensor h = ops::rms_norm(x, p.get("post_attention_layernorm.weight"), static_cast<float>(c.rms_norm_eps));
    Tensor m = ops::swiglu(ops::linear(h, p.get("mlp.gate_proj.weight")), ops::linear(h, p.get("mlp.up_proj.weight")));
    return ops::add(x, ops::linear(m, p.get("mlp.down_proj.weight")));
  }

  std::unique_ptr<PackedBlock> pack(const ModelConfig& c, const LayerParams& p, const ops::InferenceBackend& be,
                                    ops::WeightFormat format) const override {
    auto w = std::make_unique<Packed>();
    w->post_norm = be.pack_vector(p.f32("post_attention_layernorm.weight"), c.hidden_size);
    w->gate_up = pack_rows(be, p, {"mlp.gate_proj", "mlp.up_proj"}, c.hidden_size, format);
    w->down = pack_rows(be, p, {"mlp.down_proj"}, c.intermediate_size, format);
    return w;
  }

  void infer(const PackedBlock& packed, InferenceStep& s) const override {
    const Packed& w = static_cast<const Packed&>(packed);
    const int64_t H = s.c.hidden_size, I = s.c.intermediate_size, n = s.layout.tokens();
    float* h = s.be.scratch(ops::Scratch::Hidden, n * H);
    float* gu = s.be.scratch(ops::Scratch::GateUp, n * 2 * I);
    float* m = s.be.scratch(ops::Scratch::Mid, n * I);
    float* tmp = s.be.scratch(ops::Scratch::Tmp, n * H);
    s.be.rms_norm(s.x, H, *w.post_norm, h, H, n, static_cast<float>(s.c.rms_norm_eps));
    s.be.linear(*w.gate_up, h, n, H, gu, 2 * I);
    s.be.swiglu(gu, 2 * I, m, I, n, I);
    s.be.linear(*w.down, m, n, I, tmp, H);
    s.be.add_inplace(s.x, tmp, n * H);
  }
};

}  // namespace

const Block& dense_ffn() {
  static const DenseFfn block;
  return block;
}

}  // namespace corelm::model::blocks
