// The one place that maps a layer to its block kinds, from the layer's spec (ModelConfig::layer):
// full attention, sliding-window attention or linear attention as the mixer; the dense FFN.
#include "corelm/error.h"
#include "model/blocks/attention.h"
#include "model/blocks/block.h"
#include "model/blocks/dense_ffn.h"
#include "model/blocks/linear_attention.h"
#include "model/blocks/sliding_attention.h"

namespace corelm::model::blocks {

LayerBlocks layer_blocks(const ModelConfig& c, int64_t layer) {
  const LayerSpec spec = c.layer(layer);
  switch (spec.attention) {
    case AttentionKind::Sliding: return {&sliding_attention(), &dense_ffn()};
    case AttentionKind::Linear: return {&linear_attention(), &dense_ffn()};
    case AttentionKind::Full: break;
  }
  return {&full_attention(), &dense_ffn()};  // FfnKind::Dense is the only FFN kind
}

}  // namespace corelm::model::blocks
