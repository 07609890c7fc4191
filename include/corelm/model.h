// Llama/Qwen2-style decoder: token embedding -> N x (RMSNorm -> GQA attention with RoPE ->
// residual -> RMSNorm -> SwiGLU FFN -> residual) -> final RMSNorm -> LM head (tied or not).
// Parameters carry Hugging Face names ("model.layers.0.self_attn.q_proj.weight", ...) so that
// loading a HF checkpoint is a lookup, not a rewrite.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "corelm/kv_cache_type.h"
#include "corelm/tensor.h"

namespace corelm::model {

// What one decoder layer computes. Attention kinds:
//   Full    -- causal GQA attention with RoPE over every earlier position (Llama/Qwen2);
//   Sliding -- the same over the last `window` positions only (Mistral's sliding_window; the
//              cache keeps a ring of `window` entries);
//   Linear  -- log-decay linear attention with `d_state` features per head (a fixed-size
//              recurrent state instead of a KV cache; ops::linear_attention).
// The FFN is the dense SwiGLU today (a mixture of experts is a later kind).
enum class AttentionKind { Full, Sliding, Linear };
enum class FfnKind { Dense };
// HF's layer_types spellings: "full_attention" | "sliding_attention" | "linear_attention".
const char* attention_kind_name(AttentionKind k);
AttentionKind parse_attention_kind(const std::string& s);  // ValueError naming the accepted spellings

struct LayerSpec {
  AttentionKind attention = AttentionKind::Full;
  int64_t window = 0;   // Sliding: HF's sliding_window W (> 0); a query sees itself and the W
                        // positions before it (transformers 4.40 Mistral; ops::sliding_window_attention)
  int64_t d_state = 0;  // Linear: key/query features per head (> 0)
  FfnKind ffn = FfnKind::Dense;
  bool operator==(const LayerSpec&) const = default;
};

// Field names and meaning as in a Hugging Face config.json.
struct ModelConfig {
  std::string model_type = "llama";  // "llama" or "qwen2" (qwen2 implies attention_bias)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // 0 in JSON input means hidden_size / num_attention_heads
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  int64_t max_position_embeddings = 512;
  bool tie_word_embeddings = true;
  bool attention_bias = false;
  std::string torch_dtype = "float32";
  // Per-layer specs (num_hidden_layers entries), or empty: every layer Full + Dense, as in a plain
  // Llama/Qwen2 config. Read from HF's `layer_types` (with `sliding_window`), Mistral's
  // `sliding_window`, Qwen2's `use_sliding_window` + `max_window_layers` (layers from
  // max_window_layers on slide, as current transformers derives layer_types), and the corelm key
  // `linear_attention_state_size` for Linear layers; written back as `layer_types` & co.
  std::vector<LayerSpec> layers;
  // Packed training sequences: attention and recurrent state never cross a BOS token, so documents
  // packed back to back do not see each other (corelm key `bos_isolation`; needs bos_token_id).
  bool bos_isolation = false;
  double initializer_range = 0.02;
  int64_t bos_token_id = -1;  // -1: none
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;  // -1: none (HF pools the token before the first pad; see labels)

  // Sequence-classification head, as Hugging Face's LlamaForSequenceClassification: the tensor
  // "score.weight" [num_labels, hidden] (no bias) over the final-normed hidden state of the last
  // real token of each row. Present iff `labels` is non-empty; config.json then names the
  // architecture "...ForSequenceClassification" and carries HF's id2label / label2id / num_labels
  // (every HF config carries a default id2label, so only the architecture says a head exists).
  std::vector<std::string> labels;       // id2label in id order
  double classifier_temperature = 1.0;   // probs = softmax(logits / T), T fitted on a dev split
  std::string classifier_pooling = "last";  // "last" (HF) or "mean" over the real tokens
  std::string classifier_template;       // prompt template holding {text}; "" = "{text}"
  bool has_classifier() const { return !labels.empty(); }

  // Parses a config.json object; `source` (a file name) is used in error messages. Unknown keys are
  // ignored; missing required keys, wrong types and unsupported features (rope_scaling, sliding
  // window, MoE) are FormatErrors naming the field.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  static ModelConfig load(const std::string& path);  // a config.json file
  nlohmann::json to_json() const;                     // HF-compatible (architectures, model_type, ...)
  void save(const std::string& path) const;           // atomic write

  // Shipped shapes: "tiny", "small", "smollm2-135m", "hybrid" (docs/HYBRID.md). ValueError lists
  // the names for others.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  // Upper bounds on the size fields (see validate_sizes).
  static constexpr int64_t kMaxVocabSize = int64_t{1} << 22;
  static constexpr int64_t kMaxHiddenSize = int64_t{1} << 16;
  static constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;
  static constexpr int64_t kMaxLayers = int64_t{1} << 12;
  static constexpr int64_t kMaxHeads = int64_t{1} << 12;
  static constexpr int64_t kMaxHeadDim = int64_t{1} << 12;
  static constexpr int64_t kMaxPositions = int64_t{1} << 24;

  // Throws ValueError naming the field (e.g. heads not dividing hidden size, bos/eos outside the
  // vocabulary, a size above its limit).
  void validate() const;
  // Only the size fields: each positive and at most its kMax* bound.
  void validate_sizes() const;
  // Layer l's spec (Full + Dense when `layers` is empty); IndexError outside [0, num_hidden_layers).
  LayerSpec layer(int64_t l) const;
  // True when every layer is Full attention + Dense FFN (the Llama/Qwen2 decoder).
  bool all_full_attention() const;
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t num_parameters(bool include_embeddings = true) const;
};

// Every parameter a config defines, name and shape, in Decoder::named_parameters() order;
// nothing is allocated, so a loader can check a file against it first. `config` must be valid.
std::vector<std::pair<std::string, Shape>> parameter_shapes(const ModelConfig& config);

// Per-layer key/value cache for incremental decoding. Keys and values each have a KVCacheType
// (f32 by default; K and V may differ): an f32 side of layer l is one [B, Hkv, capacity, D] f32
// tensor (k(l) / v(l)); any other side is one [B, Hkv, capacity, row_bytes] u8 tensor of encoded
// head vectors (k_bytes(l) / v_bytes(l); formats in src/kernels/cpu/kv_quant.h). Each batch row has
// its own length, so rows with prompts of different lengths decode together. Everything is
// allocated up front; a type the head_dim does not fit is a ValueError naming it.
// Per layer kind (ModelConfig::layer): Full layers hold the KV above; Sliding layers a ring of
// ring_size(l) = window + 1 + kRingChunk f32 positions per row (ring_k / ring_v, position p in slot
// p % ring_size; appends longer than kRingChunk are processed in chunks, so memory is O(window)
// whatever the capacity); Linear layers the recurrent state [B, Hkv, d_state, D] f32 (state(l)).
// The KVCacheTypes apply to Full layers only: rings and states are always f32. A row's length
// still bounds its positions by the capacity. Rings and states cannot be rewound: set_length to a
// shorter non-zero length is a ValueError on a cache with such layers (0 starts the row afresh).
class KVCache {
 public:
  KVCache(const ModelConfig& config, int64_t batch, int64_t capacity, KVCacheTypes types = {});
  int64_t batch() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t layers() const { return static_cast<int64_t>(k_.size()); }
  int64_t kv_heads() const { return kv_heads_; }
  // Positions a sliding layer's ring holds beyond window + 1: the longest chunk one append step
  // attends with (longer appends are split).
  static constexpr int64_t kRingChunk = 64;
  AttentionKind layer_kind(int64_t layer) const { return kinds_.at(static_cast<size_t>(layer)); }
  int64_t ring_size(int64_t layer) const;  // Sliding layers: window + 1 + kRingChunk
  Tensor& ring_k(int64_t layer);           // Sliding: f32 [B, Hkv, ring_size, D]
  Tensor& ring_v(int64_t layer);
  Tensor& state(int64_t layer);            // Linear: f32 [B, Hkv, d_state, D]
  // False when some layer keeps a ring or a state: positions are then not separable blocks, so
  // block_bytes / read_block / write_block are ValueErrors and prefix caches must not be used.
  bool supports_prefix_blocks() const;
  int64_t head_dim() const { return head_dim_; }
  const KVCacheTypes& types() const { return types_; }
  int64_t length(int64_t row) const { return lengths_.at(row); }
  void set_length(int64_t row, int64_t len);  // e.g. 0 to reuse a row for a new sequence
  void reset();                               // all rows empty
  // The f32 buffers; ValueError when that side is not f32 (use k_bytes / v_bytes).
  Tensor& k(int64_t layer);
  Tensor& v(int64_t layer);
  // The raw buffer of either type: f32 [B, Hkv, cap, D] or u8 [B, Hkv, cap, row bytes].
  Tensor& k_bytes(int64_t layer) { return k_.at(layer); }
  Tensor& v_bytes(int64_t layer) { return v_.at(layer); }
  int64_t k_row_bytes() const { return k_row_bytes_; }  // bytes of one head vector
  int64_t v_row_bytes() const { return v_row_bytes_; }
  // Bytes one position of one row takes over all Full layers, keys and values.
  int64_t bytes_per_token() const;
  // Bytes one row holds whatever its length: the Sliding rings and the Linear states.
  int64_t fixed_bytes_per_row() const;

  // Head vectors as f32 <-> the stored encoding: positions [begin, begin + count) of kv head h of
  // `row` in layer `layer` (count * D floats). The reference path and tests use these; the fast
  // path reads the bytes directly.
  void store_keys(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, const float* x);
  void store_values(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, const float* x);
  void load_keys(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, float* x) const;
  void load_values(int64_t layer, int64_t row, int64_t head, int64_t begin, int64_t count, float* x) const;

  // Sharing computed positions between rows (a prompt's KV reused by n > 1 sequences, a prefix
  // cache). copy_row: positions [0, len) of every layer from row src to row dst, whose length
  // becomes len. copy_from: the same from a row of another cache of the same shape and types.
  // Rings and states are copied whole, so with such layers len must be the source row's length
  // (copy_from then also sets the destination's length to len).
  // Blocks: positions [begin, begin + count) of one row as block_bytes(count) bytes, copied as
  // stored (per layer: keys [Hkv, count, row bytes], then values); write_block sets no length.
  void copy_row(int64_t src, int64_t dst, int64_t len);
  void copy_from(const KVCache& src, int64_t src_row, int64_t dst_row, int64_t len);
  int64_t block_bytes(int64_t count) const;
  void read_block(int64_t row, int64_t begin, int64_t count, uint8_t* out) const;
  void write_block(int64_t row, int64_t begin, int64_t count, const uint8_t* in);

 private:
  int64_t capacity_, head_dim_ = 0, k_row_bytes_ = 0, v_row_bytes_ = 0, kv_heads_ = 0;
  KVCacheTypes types_;
  std::vector<int64_t> lengths_;
  std::vector<AttentionKind> kinds_;
  std::vector<Tensor> k_, v_;  // Full: the KV; Sliding: the rings; Linear: undefined
  std::vector<Tensor> state_;  // Linear: the recurrent state; undefined otherwise
  bool all_full_ = true;
  void check_whole_row(const KVCache& src, int64_t src_row, int64_t len, const char* fn) const;
};

// Inference numerics. F32: the op-based reference path (fp32 everywhere, the yardstick).
// BF16: the fast path -- linear weights packed once as bf16 (activations rounded to bf16 inside
// the matmuls, fp32 accumulation), fp32 residual stream, norms, softmax and KV cache.
// Int8: the same fast path with every linear (q/k/v, o, gate/up, down, LM head) quantized to int8
// (per-output-row weight scales, per-row dynamic activation scales, int32 accumulation; see
// kernels/cpu/linear_int8.h). Opt-in only: it changes outputs more than bf16 (docs/KERNELS.md
// has the measured perplexity delta). Embeddings, norms, softmax and the KV cache stay fp32.
// Q4: the layers' linears in 4 bits (blocks of 32 weights with an fp16 scale and minimum,
// activations int8 per block; kernels/cpu/linear_q4.h), the LM head in int8. Opt-in: the smallest weights (batch-1
// decode streams a quarter of bf16's bytes) at a larger perplexity cost (docs/KERNELS.md).
enum class Precision { F32, BF16, Int8, Q4 };
const char* precision_name(Precision p);          // "f32" | "bf16" | "int8" | "q4"
Precision parse_precision(const std::string& s);  // ValueError naming the accepted values
// Every name parse_precision accepts, in enum order (for CLI validators).
const std::vector<std::string>& precision_names();

// Which logits forward_cached returns: All [B, T, V]; Last [B, 1, V] (the last position of each
// row); None: no LM head, the final-normed hidden states [B, T, H] (apply logits_from_hidden to
// the rows that need logits).
enum class Logits { All, Last, None };

struct FastWeights;  // packed weights of the fast path (src/model/fast_forward.h)

class Decoder {
 public:
  explicit Decoder(ModelConfig config);  // validates; parameters allocated (zeros)

  const ModelConfig& config() const { return config_; }

  // HF initialisation: Linear/Embedding weights ~ N(0, initializer_range), norms = 1, biases = 0.
  void init_weights(uint64_t seed);

  // Parameters in a fixed order (embedding, layers in order, final norm, lm_head if untied).
  const std::vector<std::pair<std::string, Tensor>>& named_parameters() const { return params_; }
  std::vector<Tensor> parameters() const;
  Tensor& parameter(const std::string& name);  // IndexError naming the unknown name
  bool has_parameter(const std::string& name) const;
  // Copies values into the named parameter (shape must match; dtype converted). Used by loaders.
  void load_parameter(const std::string& name, const Tensor& value);
  void set_requires_grad(bool value);

  // Full-sequence forward (training, scoring): ids [B, T] (i32/i64), positions 0..T-1.
  // Returns logits [B, T, V], recorded on the autograd graph when parameters require grad.
  // With the fast path prepared (prepare_inference(BF16)) and gradient recording off
  // (NoGradGuard), forward and forward_hidden run the fast path instead (eval, scoring).
  Tensor forward(const Tensor& ids) const;
  // The final-normed hidden states [B, T, H]; lm_head() maps them to logits.
  Tensor forward_hidden(const Tensor& ids) const;
  Tensor lm_head(const Tensor& hidden) const;
  // The LM head's weight [V, H]: "lm_head.weight", or "model.embed_tokens.weight" when tied.
  std::string lm_head_weight_name() const;
  const Tensor& lm_head_weight() const;
  // "score.weight" [num_labels, H]; ValueError when the model has no classification head.
  const Tensor& classifier_weight() const;

  // Incremental forward (no autograd): ids [B, T] are appended to each row of `cache` at that
  // row's current length (rows in `rows`, one per batch entry of ids; cache row r = rows[b]),
  // positions continue from there; returns logits [B, T, V] and advances the rows' lengths.
  // A row's result does not depend on the other rows. Exceeding capacity -> ValueError.
  // With prepare_inference(BF16) this runs the fast path (src/model/blocks/ on ops' CPU backend); else
  // the op-based reference. Either way a row's outputs are bitwise identical whatever the other
  // rows, the batch size, the row's position in the batch and the thread count.
  Tensor forward_cached(const Tensor& ids, KVCache& cache, const std::vector<int64_t>& rows,
                        Logits logits = Logits::All) const;

  // Greedy decoding step: forward_cached(ids, cache, rows, Logits::Last) followed by each row's
  // argmax over ids [0, vocab_limit) (<= 0: the whole vocabulary), first index on ties -- the
  // same ids and cache effects, bitwise. The fast path fuses the argmax into the LM head (blocks
  // of columns, no [B, V] logits); it runs the last layer for every position, so it is meant for
  // decode steps (T = 1).
  std::vector<int64_t> forward_cached_argmax(const Tensor& ids, KVCache& cache, const std::vector<int64_t>& rows,
                                             int64_t vocab_limit = 0) const;

  // Hidden states [..., H] -> logits [..., V] without autograd; uses the packed LM head when the
  // fast path is prepared (so scoring callers get the same numerics as forward_cached).
  Tensor logits_from_hidden(const Tensor& hidden) const;

  // Selects the inference numerics of forward_cached / logits_from_hidden. BF16 (and Int8) pack every
  // linear weight once (q/k/v fused, gate/up fused, o, down, LM head). The packing is a snapshot:
  // load_parameter() drops it, but parameters changed in place through parameter() or by an
  // optimizer are NOT seen until prepare_inference() is called again. Training (forward,
  // forward_hidden, lm_head) always uses the parameters directly.
  void prepare_inference(Precision p = Precision::BF16);
  void drop_inference();  // back to the reference path, packed weights freed
  Precision inference_precision() const { return fast_ ? fast_precision_ : Precision::F32; }
  bool inference_prepared() const { return prepared_; }

  // What the caches this decoder makes store for keys and values (f32 by default). make_cache is
  // how callers get a cache: batch rows x capacity positions, typed as set here.
  void set_kv_cache_types(KVCacheTypes types);
  const KVCacheTypes& kv_cache_types() const { return kv_types_; }
  KVCache make_cache(int64_t batch, int64_t capacity) const;

 private:
  ModelConfig config_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::map<std::string, size_t> index_;
  bool prepared_ = false;
  std::shared_ptr<const FastWeights> fast_;  // set when prepared for BF16 or Int8
  Precision fast_precision_ = Precision::BF16;  // what fast_ was packed as
  KVCacheTypes kv_types_;
};

}  // namespace corelm::model
