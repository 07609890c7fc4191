// The op contracts. Every op checks shapes and dtypes (ShapeError/DTypeError naming the shapes),
// dispatches on the device to a kernel, and records its backward on the autograd graph when an
// input requires grad. Floating ops compute in f32 (inputs must be f32 unless stated); index
// tensors are i32 or i64. Results never depend on the thread count.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "corelm/tensor.h"

namespace corelm {
class Generator;
}

namespace corelm::ops {

// ---- differentiable views and shape ops (src/ops/shape.cc) ----
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor contiguous(const Tensor& x);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Sums `g` down to `shape` (the inverse of broadcasting); used by backward formulas.
Tensor sum_to(const Tensor& g, const Shape& shape);

// ---- elementwise with PyTorch broadcasting (src/ops/elementwise.cc) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float s);        // x * s
Tensor add_scalar(const Tensor& x, float s);   // x + s
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor square(const Tensor& x);

// ---- reductions (src/ops/reduce.cc) ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor sum(const Tensor& x);  // all elements -> scalar (shape [])
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);

// ---- matmul (src/ops/matmul.cc) ----
// a: [..., M, K] (or [..., K, M] with transpose_a), b: [..., K, N] (or [..., N, K] with
// transpose_b); leading batch dims broadcast; 1-D operands are not accepted.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// x @ weight^T (+ bias): the nn.Linear convention, weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- embedding (src/ops/embedding.cc) ----
// weight [V, D], ids i32/i64 of any shape -> [...ids.shape, D]; ids out of range -> IndexError.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// ---- activations (src/ops/activation.cc) ----
Tensor silu(const Tensor& x);
Tensor swiglu(const Tensor& gate, const Tensor& up);  // silu(gate) * up, same shapes
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
// Inverted dropout: zeroes with probability p and scales survivors by 1/(1-p); identity when
// !training or p == 0. The mask is drawn from `gen`, so a seed reproduces it.
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen);

// ---- normalisation (src/ops/norm.cc) ----
// x [..., D] * rsqrt(mean(x^2) + eps) * weight[D]  (Llama/Qwen RMSNorm)
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps);

// ---- rotary position embedding (src/ops/rope.cc) ----
// x [B, H, T, D] (D even); rotate-half convention of HF Llama/Qwen: pairs (i, i + D/2) rotated
// by angle pos * theta^(-2i/D), pos = position_offset + t. Linear in x, so backward is the
// inverse rotation.
Tensor rope(const Tensor& x, float theta, int64_t position_offset = 0);

// ---- attention (src/ops/attention.cc) ----
// Causal scaled-dot-product attention with grouped-query heads.
// q [B, Hq, T, D], k/v [B, Hkv, S, D], Hq % Hkv == 0 (query head h reads kv head h / (Hq/Hkv)).
// Query t sits at absolute position S - T + t and sees keys 0..S-T+t. scale defaults to
// 1/sqrt(D). Returns [B, Hq, T, D].
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        std::optional<float> scale = std::nullopt);

// ---- sliding-window attention (src/ops/sliding_attention.cc) ----
// Causal attention restricted to a window, with optional document isolation. Layouts, GQA mapping
// and positions as causal_attention (query t at absolute position S - T + t). The query at
// position i sees key j iff
//   j <= i,  and  i - j <= window when window > 0  (window <= 0: unbounded, plain causal),
//   and doc_ids[j] == doc_ids[i] when doc_ids is given.
// So a window W admits W + 1 keys counting the query's own: the convention of transformers 4.40.2
// Mistral (modeling_attn_mask_utils masks keys with i - j > sliding_window), which
// tests/oracle/test_sliding_attention_oracle.cc checks against transformers itself.
// doc_ids: i32/i64 [B, S], non-decreasing along each row (a document index per key position; the
// queries use the last T); packed documents never see each other, a query always sees itself.
// The fast path saves only the probabilities of a band of keys per query row (memory
// O(T * (W + 64)), not O(T * S)). Returns [B, Hq, T, D]; backward gives q, k and v gradients.
Tensor sliding_window_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window,
                                const Tensor& doc_ids = Tensor(), std::optional<float> scale = std::nullopt);

// ---- log-decay linear attention (src/ops/linear_attention.cc) ----
// A linear-attention layer with a learned per-channel, data-independent decay: the per-channel
// "time decay" of RWKV-4 (Peng et al., "RWKV: Reinventing RNNs for the Transformer Era", 2023) in
// the matrix-state form of gated linear attention (Yang et al., "Gated Linear Attention
// Transformers with Hardware-Efficient Training", 2023), whose chunked form the fast kernel uses.
// Per batch row b and kv head g, with a = log_decay[g] (every entry <= 0) and a state
// S_t [d_s, d_v], S_{-1} = initial_state[b, g] (zeros when undefined):
//   S_t = diag(exp(a)) S_{t-1} + k_t v_tᵀ
//   o_t = scale · S_tᵀ q_t        for each query head h of kv head g = h / (Hq / Hkv)
// q [B, Hq, T, d_s], k [B, Hkv, T, d_s], v [B, Hkv, T, d_v], log_decay [Hkv, d_s], all f32;
// returns [B, Hq, T, d_v]. scale defaults to 1: no normalisation happens here (the model applies
// its own feature map / normalisation to q and k). doc_ids (i32/i64 [B, T], non-decreasing along
// each row) isolates packed documents: the state is zeroed before position t whenever
// doc_ids[b, t] != doc_ids[b, t - 1] (initial_state only reaches the document at position 0).
// final_state, when not null, receives S_{T-1} [B, Hkv, d_s, d_v] (no gradient through it).
// Gradients reach q, k, v and log_decay; none flows to initial_state. Errors: ShapeError for
// shapes that disagree, DTypeError, ValueError for a log_decay entry > 0 (or not finite) and for
// doc_ids that decrease. Computes in f32, also inside a ComputeDTypeScope(BF16). Results do not
// depend on the thread count or on the other batch rows.
Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_decay,
                        const Tensor& doc_ids = Tensor(), const Tensor& initial_state = Tensor(),
                        Tensor* final_state = nullptr, std::optional<float> scale = std::nullopt);

// ---- losses (src/ops/loss.cc) ----
// logits [N, V] f32, targets [N] i32/i64; mean NLL over targets != ignore_index (0 if none).
// A target outside [0, V) that is not ignore_index -> IndexError.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// ---- fused LM head + cross-entropy (src/ops/linear_cross_entropy.cc) ----
// hidden [N, H] f32, weight [V, H] f32, targets [N] i32/i64: the value of
// cross_entropy(linear(hidden, weight), targets, ignore_index) without materialising the [N, V]
// logits (row chunks; see kernels/cpu/lm_head_loss.h). When an input requires grad, the gradients
// are computed in the same pass and the backward only scales them. Inside a
// ComputeDTypeScope(BF16) (corelm/autocast.h) hidden and weight are rounded to bf16 first.
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index = -100);

// Sampled softmax: the softmax runs over `candidates` only (i64 [C], strictly increasing, in
// [0, V), holding every non-ignored target), with logit_c = hidden . weight_c - log_correction_c
// (log_correction f32 [C]: the log of how often the proposal includes c; all zeros with every class
// as candidate gives exactly linear_cross_entropy). Mean over non-ignored rows. Gradients reach
// hidden and the candidate rows of weight (the other rows get zero). A target missing from the
// candidates -> ValueError.
Tensor sampled_linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                                    const Tensor& candidates, const Tensor& log_correction,
                                    int64_t ignore_index = -100);

}  // namespace corelm::ops
