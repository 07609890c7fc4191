// GGUF (llama.cpp's file format), versions 2 and 3, little-endian: "GGUF", u32 version,
// u64 tensor count, u64 metadata count, metadata key/values, tensor infos (name, dims with the
// fastest-varying first, ggml type, offset into the data section), padding to the alignment
// (general.alignment, default 32), then the data section. The reader memory-maps the file and
// validates everything (counts and string lengths bounded by the file, known types, aligned
// offsets, tensor bytes inside the file) before returning; every error names the file and the
// key or tensor concerned.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "corelm/tensor.h"

namespace corelm::io {

enum class GGUFType : uint32_t {
  Uint8 = 0, Int8 = 1, Uint16 = 2, Int16 = 3, Uint32 = 4, Int32 = 5, Float32 = 6, Bool = 7,
  String = 8, Array = 9, Uint64 = 10, Int64 = 11, Float64 = 12,
};
const char* gguf_type_name(GGUFType t);

// ggml tensor types this reader knows. Q8_0 and Q4_0 are blocks of 32 values with an f16 scale;
// they are dequantised to f32 on read and quantised on write.
enum class GGMLType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, BF16 = 30 };
const char* ggml_type_name(GGMLType t);
uint64_t ggml_nbytes(GGMLType t, int64_t numel);  // numel a multiple of 32 for block types

// One metadata value. Integers are kept in `i` (signed types and bool) or `u` (unsigned types),
// floats in `f`; arrays hold their elements (all of `array_type`) in `array`.
struct GGUFValue {
  GGUFType type = GGUFType::Uint32;
  GGUFType array_type = GGUFType::Uint8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  std::vector<GGUFValue> array;

  static GGUFValue of(GGUFType t, int64_t signed_or_unsigned);  // integer types and Bool
  static GGUFValue of_float(GGUFType t, double v);             // Float32 / Float64
  static GGUFValue of_string(std::string v);
  static GGUFValue of_array(GGUFType element_type, std::vector<GGUFValue> values);
  static GGUFValue of_strings(const std::vector<std::string>& values);

  // Conversions; ValueError naming the actual type when it does not fit.
  int64_t as_int() const;
  double as_float() const;  // any numeric type
  const std::string& as_string() const;
  bool operator==(const GGUFValue& o) const;
};

struct GGUFTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous (fastest) dimension
  GGMLType type = GGMLType::F32;
  uint64_t offset = 0;      // relative to the data section
  uint64_t nbytes = 0;
  Shape shape() const;      // row-major order: reversed ne
};

class GGUFFile {
 public:
  // IOError (missing/unreadable) or FormatError naming the file and the key/tensor.
  static GGUFFile open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return metadata_; }
  const GGUFValue* find(const std::string& key) const;  // nullptr if absent
  const GGUFValue& at(const std::string& key) const;    // IndexError naming the file and key
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo& info(const std::string& name) const;  // IndexError naming file and tensor

  // Row-major tensor (shape = reversed ne): F32/F16/BF16 as zero-copy views of the mapping,
  // Q8_0/Q4_0 dequantised into a fresh f32 tensor.
  Tensor get(const std::string& name) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::shared_ptr<Storage> mapping_;
  std::vector<std::pair<std::string, GGUFValue>> metadata_;
  std::vector<GGUFTensorInfo> tensors_;
};

struct GGUFWriteTensor {
  std::string name;
  Tensor value;                  // any float dtype, row-major shape; converted to `type`
  GGMLType type = GGMLType::F32;
};

// Writes a GGUF v3 file atomically. general.alignment in `metadata` (u32) sets the alignment,
// else 32. Block types need the last dimension to be a multiple of 32 (ValueError naming the
// tensor). Duplicate keys or tensor names are ValueErrors.
void save_gguf(const std::string& path, const std::vector<std::pair<std::string, GGUFValue>>& metadata,
               const std::vector<GGUFWriteTensor>& tensors);

// Block (de)quantisation, exposed for tests: n a multiple of 32.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out);
void dequantize_q8_0(const uint8_t* in, int64_t n, float* y);
void quantize_q4_0(const float* x, int64_t n, uint8_t* out);
void dequantize_q4_0(const uint8_t* in, int64_t n, float* y);

// llama.cpp's conventions for Llama/Qwen2 checkpoints, so the io layer can turn a Hugging Face
// config.json object + HF-named tensors into a GGUF that llama.cpp loads, and back:
// names model.embed_tokens.weight <-> token_embd.weight, model.norm.weight <-> output_norm.weight,
// lm_head.weight <-> output.weight, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj} <-> blk.N.{attn_norm, attn_{q,k,v,output},
// ffn_norm, ffn_{gate,up,down}} (.weight/.bias kept); arch keys llama.* / qwen2.*; and, for
// llama only, q/k rows permuted per head from HF's rotate-half to the interleaved RoPE pairs
// llama.cpp applies (qwen2 uses NEOX RoPE in llama.cpp: no permutation).
std::string gguf_name_from_hf(const std::string& hf_name);  // ValueError for names it does not know
std::string hf_name_from_gguf(const std::string& gguf_name);

struct GGUFModel {
  nlohmann::json config;  // HF config.json keys
  std::vector<std::pair<std::string, Tensor>> tensors;  // HF names, f32, HF (rotate-half) layout
};

// `weight_type` applies to 2-D tensors whose rows fit its blocks (others are stored F16 when a
// block type was asked for); 1-D tensors (norms, biases) are always F32, as llama.cpp does.
// `extra` metadata (e.g. tokenizer.ggml.*) is appended after the architecture keys.
void save_gguf_model(const std::string& path, const nlohmann::json& config,
                     const std::vector<std::pair<std::string, Tensor>>& hf_tensors,
                     GGMLType weight_type = GGMLType::F32,
                     const std::vector<std::pair<std::string, GGUFValue>>& extra = {});
// FormatError naming the file and key/tensor for a missing architecture key, an unsupported
// architecture, a missing tensor or one whose shape disagrees with the metadata.
GGUFModel load_gguf_model(const std::string& path);

}  // namespace corelm::io
