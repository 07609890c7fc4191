// What every block kind shares: parameter lookup, fused-row packing, keeping the last tokens.
#include "model/blocks/block.h"

#include "corelm/error.h"

namespace corelm::model::blocks {

LayerParams::LayerParams(const Table& params, const Index& index, int64_t layer)
    : params_(params), index_(index), prefix_("model.layers." + std::to_string(layer) + ".") {}

const Tensor& LayerParams::get(const std::string& suffix) const {
  auto it = index_.find(name(suffix));
  if (it == index_.end()) throw IndexError("Decoder: no parameter '" + name(suffix) + "'");
  return params_[it->second].second;
}

Tensor LayerParams::get_opt(const std::string& suffix) const {
  auto it = index_.find(name(suffix));
  return it == index_.end() ? Tensor() : params_[it->second].second;
}

const float* LayerParams::f32(const std::string& suffix) const {
  const Tensor& t = get(suffix);
  CORELM_CHECK(t.is_contiguous() && t.dtype() == DType::F32, DTypeError, "pack_fast_weights: parameter '", name(suffix),
               "' must be contiguous f32");
  return t.data<float>();
}

// Int8 scales are per output row and q4 scales per 32 inputs of one row, so fusing rows changes
// no scale: the fused linear computes bitwise what the separate ones would.
std::unique_ptr<ops::PackedLinear> pack_rows(const ops::InferenceBackend& be, const LayerParams& p,
                                             const std::vector<std::string>& names, int64_t k, ops::WeightFormat format) {
  std::vector<float> w, bias;
  bool any_bias = false;
  for (const auto& name : names) any_bias |= p.has(name + ".bias");
  for (const auto& name : names) {
    const int64_t rows = p.get(name + ".weight").size(0);
    const float* W = p.f32(name + ".weight");
    w.insert(w.end(), W, W + rows * k);
    if (p.has(name + ".bias")) {
      const float* b = p.f32(name + ".bias");
      bias.insert(bias.end(), b, b + rows);
    } else if (any_bias) {
      bias.insert(bias.end(), static_cast<size_t>(rows), 0.0f);
    }
  }
  const int64_t n = static_cast<int64_t>(w.size()) / k;
  return be.pack_linear(w.data(), n, k, any_bias ? bias.data() : nullptr, format);
}

void InferenceStep::keep_last_only(float* extra, int64_t extra_ld, int64_t extra_width) {
  const int64_t B = layout.rows, T = layout.per_row, H = c.hidden_size;
  if (T <= 1) return;
  // Row b moves from b*T + T - 1 to b: never onto a row still to be moved.
  for (int64_t b = 0; b < B; ++b) {
    if (extra) be.copy(extra + b * extra_ld, extra + (b * T + T - 1) * extra_ld, extra_width);
    be.copy(x + b * H, x + (b * T + T - 1) * H, H);
  }
  layout.offset += T - 1;
  layout.per_row = 1;
}

}  // namespace corelm::model::blocks
