// The architecture name table: every parameter of the Llama/Qwen2 decoder under its name in each
// format corelm reads or writes -- Hugging Face checkpoints (the model's own names), llama.cpp GGUF
// files and llama2.c checkpoints -- and the conversions between a format's model conventions and
// the model's. The io layer only reads and writes named tensors (io::GGUFFile, io::save_gguf,
// io::load_llama2c_checkpoint); everything that knows what a tensor *is* lives here, in one table.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "corelm/gguf.h"
#include "corelm/llama2c.h"
#include "corelm/tensor.h"

namespace corelm::model {

// One parameter role. Layer roles carry the part after "model.layers.N." / "blk.N." / the
// llama2.c stacked array (indexed by layer); global roles are whole names. `rope_rows`: the rows
// are permuted per head between HF's rotate-half pairs (i, i + D/2) and the interleaved pairs
// (2i, 2i+1) of llama.cpp's llama architecture and of llama2.c.
// `raw`: a bare parameter, not a module's weight: its names carry no .weight/.bias suffix
// (HF "model.layers.N.self_attn.decay" <-> GGUF "blk.N.attn_decay", as llama.cpp names Mamba's
// ssm_a) and GGUF files keep it F32 whatever the weight type, as they keep norms.
struct ParameterName {
  const char* hf;
  const char* gguf;
  const char* llama2c;  // nullptr: llama2.c has no such tensor (biases, corelm-only roles)
  bool rope_rows;
  bool raw = false;
};
const std::vector<ParameterName>& layer_parameter_names();   // in llama2.c's file order
const std::vector<ParameterName>& global_parameter_names();  // embedding, final norm, LM head
// The layer roles only corelm's hybrid has (docs/HYBRID.md): the linear-attention layer's decay
// [Hkv, d_state] (raw) and its per-head output norm [head_dim]. No llama2.c form; in GGUF files
// of architecture corelm_hybrid only (kHybridGGUFArch).
const std::vector<ParameterName>& hybrid_layer_parameter_names();
// The table entry of a per-layer HF name ("model.layers.N.<role>[.weight|.bias]") from either
// layer table, with N in *layer when given (-1 when N does not fit int64); nullptr for any other name.
const ParameterName* find_layer_parameter(const std::string& hf_name, int64_t* layer = nullptr);

// HF <-> llama.cpp names: model.embed_tokens.weight <-> token_embd.weight, model.norm.weight <->
// output_norm.weight, lm_head.weight <-> output.weight, model.layers.N.<role>.{weight,bias} <->
// blk.N.<gguf role>.{weight,bias}. ValueError for a name the table does not hold.
std::string gguf_name_from_hf(const std::string& hf_name);
std::string hf_name_from_gguf(const std::string& gguf_name);

// Reorders each head's rows: to_interleaved maps rotate-half (HF) rows to interleaved ones, else
// the inverse. w is [n_heads * D, in] or a bias [n_heads * D]; returns a new f32 tensor.
Tensor permute_rope_rows(const Tensor& w, int64_t n_heads, bool to_interleaved);

// ---- llama.cpp GGUF (src/model/gguf_model.cc; the hybrid in src/model/gguf_hybrid.cc)
// general.architecture of a corelm hybrid (a model with sliding-window or linear-attention
// layers): llama-style keys under this prefix plus corelm's own (docs/INTEROP.md, "corelm_hybrid
// GGUF"); llama.cpp and other GGUF runtimes do not know it and refuse the file.
inline constexpr const char* kHybridGGUFArch = "corelm_hybrid";
struct GGUFModel {
  nlohmann::json config;  // HF config.json keys
  std::vector<std::pair<std::string, Tensor>> tensors;  // HF names, f32, HF (rotate-half) layout
};

// Writes HF-named tensors + a config.json object as a GGUF llama.cpp loads: arch keys llama.* /
// qwen2.*. A config with sliding-window or linear-attention layers (layer_types, Mistral's
// sliding_window, model_type corelm_hybrid) is written as architecture corelm_hybrid instead (only
// llama-style ones: a qwen2 config with such layers is a ValueError); its rotary (full and
// sliding) layers get the llama q/k permutation, its linear layers (no RoPE) none; for llama the q/k rows are permuted to the interleaved pairs llama.cpp's llama
// architecture rotates (qwen2 uses NEOX RoPE there: no permutation). `weight_type` applies to 2-D
// tensors whose rows fit its blocks; a row that a k-quant's 256 does not divide falls back to a
// 32-value type of about as many bits (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, as llama.cpp's
// quantizer does), and a row that 32 does not divide to F16. 1-D tensors (norms, biases) are
// always F32, as llama.cpp does. `extra` metadata (e.g. tokenizer.ggml.*) follows the arch keys.
void save_gguf_model(const std::string& path, const nlohmann::json& config,
                     const std::vector<std::pair<std::string, Tensor>>& hf_tensors,
                     io::GGMLType weight_type = io::GGMLType::F32,
                     const std::vector<std::pair<std::string, io::GGUFValue>>& extra = {});
// FormatError naming the file and key/tensor for a missing architecture key, an unsupported
// architecture, a missing tensor or one whose shape disagrees with the metadata. A corelm_hybrid
// file's config comes back as ModelConfig::to_json writes it (layer_types & co.); its corelm keys
// are checked: unknown corelm_hybrid.* keys, layer_types not one known kind per block, a missing
// or non-positive sliding_window / state_size where a layer needs it are FormatErrors naming the key.
GGUFModel load_gguf_model(const std::string& path);

// ---- llama2.c (src/model/arch_names.cc)
// A llama2.c checkpoint as the model's config.json keys (model_type llama, rms_norm_eps 1e-5,
// rope_theta 1e4, bos 1, eos 2) and HF-named per-layer tensors, q/k rows un-permuted from the
// interleaved pairs to rotate-half.
struct Llama2cModel {
  nlohmann::json config;
  std::vector<std::pair<std::string, Tensor>> tensors;
};
Llama2cModel llama2c_model(const io::Llama2cCheckpoint& checkpoint);
Llama2cModel load_llama2c_model(const std::string& path);  // io::load_llama2c_checkpoint + the above

}  // namespace corelm::model
