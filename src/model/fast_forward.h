// The fast inference path of Decoder::forward_cached: weights packed once (bf16, int8 or q4, q/k/v
// and gate/up fused), then a forward over raw fp32 buffers in a reusable per-thread workspace with
// the fused kernels of kernels/cpu/fused.h. Internal to the model component.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "corelm/model.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_attention.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_q4.h"

namespace corelm::model {

// One packed linear in one of three packings; the other two members are empty.
struct FastLinear {
  enum class Kind { BF16, Int8, Q4 };
  Kind kind = Kind::BF16;
  kernels::PackedLinear bf16;
  kernels::PackedLinearI8 i8;
  kernels::PackedLinearQ4 q4;
  int64_t n() const { return kind == Kind::Int8 ? i8.n : kind == Kind::Q4 ? q4.n : bf16.n; }
  int64_t k() const { return kind == Kind::Int8 ? i8.k : kind == Kind::Q4 ? q4.k : bf16.k; }
  // Y[m, n] = X[m, k] W^T (+ bias) with the kernel of the packing.
  void run(const float* X, int64_t m, int64_t ldx, float* Y, int64_t ldy) const {
    switch (kind) {
      case Kind::Int8: return kernels::linear_int8(X, m, ldx, i8, Y, ldy);
      case Kind::Q4: return kernels::linear_q4(X, m, ldx, q4, Y, ldy);
      case Kind::BF16: return kernels::linear_bf16(X, m, ldx, bf16, Y, ldy);
    }
  }
};

struct FastLayer {
  std::vector<float> in_norm, post_norm;
  FastLinear qkv;      // [Q + 2 KV, H]: q rows, then k, then v (biases fused too)
  FastLinear o;        // [H, Q]
  FastLinear gate_up;  // [2 I, H]: gate rows, then up rows
  FastLinear down;     // [H, I]
};

inline constexpr int64_t kLmHeadBlock = 4096;

// RoPE cos/sin rows for positions [0, n), grown on demand to the positions a forward reaches.
// Sized by use, not by max_position_embeddings: a config claiming a 16M context would otherwise
// cost gigabytes and minutes of trigonometry before the first token. Entries do not depend on
// the table size, so growing never changes a result. Safe to share between threads.
class RopeTables {
 public:
  RopeTables(int64_t head_dim, float theta) : head_dim_(head_dim), theta_(theta) {}
  // A table covering positions [0, positions); the caller keeps the pointer for its forward.
  std::shared_ptr<const kernels::RopeTable> at_least(int64_t positions) const;

 private:
  int64_t head_dim_;
  float theta_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const kernels::RopeTable> table_;
};

struct FastWeights {
  std::vector<FastLayer> layers;
  std::vector<float> final_norm;
  // [V, H] packed as blocks of kLmHeadBlock output rows (the last may be shorter), so the greedy
  // head can keep a running argmax over a small buffer; fast_lm_head runs the same blocks, so the
  // fused argmax sees bitwise the logits fast_lm_head returns.
  std::vector<FastLinear> lm_head;
  Tensor embed;                   // the fp32 embedding parameter (shared, not copied)
  std::unique_ptr<RopeTables> rope;
};

// Packs for `precision` (BF16, Int8 or Q4; ValueError for F32, which has no fast path). Q4 packs
// the layers' linears in 4 bits (kernels::preferred_q4_format()) and the LM head in int8.
FastWeights pack_fast_weights(const Decoder& decoder, Precision precision = Precision::BF16);

// Runs the forward for ids [B, T] (already validated by the caller) appended at `start[b]` of
// cache row rows[b]; does not touch the cache lengths.
Tensor fast_forward_cached(const FastWeights& w, const ModelConfig& c, const Tensor& ids, KVCache& cache,
                           const std::vector<int64_t>& rows, const std::vector<int64_t>& start, Logits logits);

// hidden [N, H] contiguous fp32 -> logits [N, V] through the packed LM head.
void fast_lm_head(const FastWeights& w, const float* hidden, int64_t n, float* logits);

// hidden [N, H] -> ids[i] = the argmax of logits row i over columns [0, limit) (limit <= 0 or
// > V: all of them), first index on ties, exactly as argmax over fast_lm_head's row (the same
// blocks run on the same inputs). Never materialises more than N x kLmHeadBlock logits.
void fast_lm_head_argmax(const FastWeights& w, const float* hidden, int64_t n, int64_t* ids, int64_t limit = 0);

}  // namespace corelm::model
