// The one place that maps a layer to its block kinds, from the layer's spec (ModelConfig::layer).
// Today's kinds: full attention + the dense FFN. The sliding-window mixer (ring cache) and the
// linear-attention mixer (recurrent state) are new files in this folder returned here for their
// AttentionKind; until they exist such a layer is refused, never computed as full attention.
#include "corelm/error.h"
#include "model/blocks/attention.h"
#include "model/blocks/block.h"
#include "model/blocks/dense_ffn.h"

namespace corelm::model::blocks {

LayerBlocks layer_blocks(const ModelConfig& c, int64_t layer) {
  const LayerSpec spec = c.layer(layer);
  CORELM_CHECK(spec.attention == AttentionKind::Full, ValueError, "layer ", layer, " is ",
               attention_kind_name(spec.attention), ": no block of that kind yet (src/model/blocks/)");
  return {&full_attention(), &dense_ffn()};  // FfnKind::Dense is the only FFN kind
}

}  // namespace corelm::model::blocks
