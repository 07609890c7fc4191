// A decoder layer is two blocks applied in turn to the residual stream: a sequence mixer (today
// full GQA attention with RoPE, blocks/attention.cc) and a feed-forward block (today the dense
// SwiGLU FFN, blocks/dense_ffn.cc). Each block kind lives in one file holding everything about it:
//   - its parameters (HF names, shapes),
//   - its training forward on the differentiable ops (the autograd tape gives the backward),
//   - its reference incremental forward (ops, no tape) against the layer's cache,
//   - its packing for an inference backend and its inference forward against that backend
//     (ops/inference_backend.h), which the CPU fast path and any later device backend share.
// Decoder (decoder.cc) only loops: embedding -> per layer: mixer, FFN -> final norm -> head.
//
// Adding a block kind (sliding-window attention with a ring cache, linear attention with a
// recurrent state, an MoE FFN): write blocks/<kind>.{h,cc} implementing Block, and return it
// for the layers whose LayerSpec asks for it in layer_blocks() (blocks/layer_blocks.cc), which is the
// only place that maps a layer to its kinds. If it needs a backend operation the interface lacks
// (a ring-cache write, a recurrent-state update), add it to ops::InferenceBackend and to every
// backend (cpu_backend.cc), per layer op rather than per token. A kind whose cache is not the
// full KV cache reads its own per-layer state from the cache object it is handed.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "corelm/model.h"
#include "corelm/tensor.h"
#include "ops/inference_backend.h"

namespace corelm::model::blocks {

// The parameters of one layer, looked up by their HF name relative to the layer's prefix
// ("model.layers.<l>."), e.g. "self_attn.q_proj.weight".
class LayerParams {
 public:
  using Table = std::vector<std::pair<std::string, Tensor>>;
  using Index = std::map<std::string, size_t>;
  LayerParams(const Table& params, const Index& index, int64_t layer);
  std::string name(const std::string& suffix) const { return prefix_ + suffix; }
  bool has(const std::string& suffix) const { return index_.count(name(suffix)) != 0; }
  const Tensor& get(const std::string& suffix) const;  // IndexError when absent
  Tensor get_opt(const std::string& suffix) const;     // undefined when absent
  // The data of a contiguous f32 parameter, for packing (DTypeError otherwise).
  const float* f32(const std::string& suffix) const;

 private:
  const Table& params_;
  const Index& index_;
  std::string prefix_;
};

// Packs the row-concatenation of several [rows_i, k] linears "<name>.weight" (and their biases
// "<name>.bias", zeros for those without one when any has one) as one linear.
std::unique_ptr<ops::PackedLinear> pack_rows(const ops::InferenceBackend& be, const LayerParams& p,
                                             const std::vector<std::string>& names, int64_t k, ops::WeightFormat format);

// Where the rows of one forward_cached call sit in the cache (the reference path).
struct CachedRows {
  int64_t B = 0, T = 0;
  const std::vector<int64_t>& rows;   // cache row of batch entry b
  const std::vector<int64_t>& start;  // position of its first token
};

// One layer's inference forward against a backend: x [layout.tokens(), H] is the residual stream
// (backend scratch) each block updates in place.
struct InferenceStep {
  const ops::InferenceBackend& be;
  const ModelConfig& c;
  float* x;
  ops::TokenLayout layout;  // the tokens x holds now
  KVCache& cache;
  const ops::RopeTable& rope;
  int64_t layer = 0;
  // This layer may keep only each row's last token once its cache state holds every token
  // (Logits::Last on the last layer): keep_last_only() then moves those rows to the front.
  bool last_only = false;
  // Moves each row's last token to row b of x and of `extra` (its first `extra_width` floats of
  // row stride `extra_ld`; extra may be null), and narrows the layout to them.
  void keep_last_only(float* extra, int64_t extra_ld, int64_t extra_width);
};

// Packed weights of one block for one backend.
class PackedBlock {
 public:
  virtual ~PackedBlock() = default;
};

using ShapeList = std::vector<std::pair<std::string, Shape>>;

// What a training forward needs beyond the layer's parameters: the batch shape, the layer index
// (its LayerSpec: window, d_state) and, with bos_isolation, doc_ids [B, T] (i64: the running count
// of BOS tokens along each row; undefined otherwise) that every mixer must respect.
struct ForwardContext {
  int64_t B = 0, T = 0;
  int64_t layer = 0;
  Tensor doc_ids;
};

// One block kind. Stateless: the weights are the decoder's parameters (or a PackedBlock).
class Block {
 public:
  virtual ~Block() = default;
  virtual const char* kind() const = 0;
  // Appends the block's parameters of layer `prefix`: projections (and biases) to `projections`,
  // norm weights to `norms` (HF lists a layer's projections first, then its norms).
  virtual void parameter_shapes(const ModelConfig& c, int64_t layer, const std::string& prefix, ShapeList& projections,
                                ShapeList& norms) const = 0;
  // Training / full-sequence forward: x [B*T, H] -> x + block(norm(x)), on the tape.
  virtual Tensor forward(const ModelConfig& c, const LayerParams& p, const Tensor& x, const ForwardContext& ctx) const = 0;
  // The reference incremental forward (no tape): x [B*T, H] for the rows in `at`, appended to
  // their cache state in layer `layer`. Blocks without state run forward().
  virtual Tensor forward_cached(const ModelConfig& c, const LayerParams& p, const Tensor& x, KVCache& cache,
                                int64_t layer, const CachedRows& at) const {
    (void)cache;
    return forward(c, p, x, ForwardContext{at.B, at.T, layer, Tensor()});
  }
  virtual std::unique_ptr<PackedBlock> pack(const ModelConfig& c, const LayerParams& p, const ops::InferenceBackend& be,
                                            ops::WeightFormat format) const = 0;
  virtual void infer(const PackedBlock& w, InferenceStep& step) const = 0;
};

struct LayerBlocks {
  const Block* mixer;
  const Block* ffn;
};
// The block kinds of layer `layer` of `c`, from c.layer(layer); ValueError for a kind with no block yet.
LayerBlocks layer_blocks(const ModelConfig& c, int64_t layer);

}  // namespace corelm::model::blocks
