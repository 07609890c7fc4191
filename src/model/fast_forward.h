// The packed inference weights of a Decoder (prepare_inference): every layer's blocks packed once
// for an inference backend (ops/inference_backend.h; today the CPU backend: bf16, int8 or q4,
// q/k/v and gate/up fused), the final norm, the LM head, and the RoPE tables. The forward that
// runs them is Decoder::forward_cached's layer loop (decoder.cc); each block's inference forward
// lives in its block file (blocks/). Internal to the model component.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "corelm/model.h"
#include "model/blocks/block.h"
#include "ops/inference_backend.h"

namespace corelm::model {

// Output rows per LM-head block (the greedy head keeps a running argmax over this many columns).
inline constexpr int64_t kLmHeadBlock = ops::kCpuLmHeadBlock;

struct FastLayer {
  std::unique_ptr<blocks::PackedBlock> mixer;  // blocks::layer_blocks(config, l).mixer, packed
  std::unique_ptr<blocks::PackedBlock> ffn;
};

struct FastWeights {
  const ops::InferenceBackend* backend = nullptr;
  std::vector<FastLayer> layers;
  std::unique_ptr<ops::PackedVector> final_norm;
  // [V, H] packed in blocks of output rows; fast_lm_head and fast_lm_head_argmax run the same
  // blocks, so the fused argmax sees bitwise the logits fast_lm_head returns.
  std::unique_ptr<ops::PackedHead> lm_head;
  Tensor embed;  // the fp32 embedding parameter (shared, not copied)
  // Grown to the positions a forward reaches, not sized by max_position_embeddings (a config
  // claiming a 16M context would otherwise cost gigabytes before the first token).
  std::unique_ptr<ops::RopeTables> rope;
};

// Packs for `precision` (BF16, Int8 or Q4; ValueError for F32, which has no fast path) on the CPU
// backend. Q4 packs the layers' linears in 4 bits and the LM head in int8.
FastWeights pack_fast_weights(const Decoder& decoder, Precision precision = Precision::BF16);

// hidden [N, H] contiguous fp32 -> logits [N, V] through the packed LM head.
void fast_lm_head(const FastWeights& w, const float* hidden, int64_t n, float* logits);

// hidden [N, H] -> ids[i] = the argmax of logits row i over columns [0, limit) (limit <= 0 or
// > V: all of them), first index on ties, exactly as argmax over fast_lm_head's row (the same
// blocks run on the same inputs). Never materialises more than N x kLmHeadBlock logits.
void fast_lm_head_argmax(const FastWeights& w, const float* hidden, int64_t n, int64_t* ids, int64_t limit = 0);

}  // namespace corelm::model
