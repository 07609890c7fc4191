// ggml's block-quantised tensor types (llama.cpp's legacy Q4_0..Q8_0 and the "k-quants" Q2_K..Q6_K):
// one table of block geometry and one readable decoder per type, used by the GGUF reader to
// dequantise to f32, plus encoders for the types `corelm convert` writes. A type's values are
// split into blocks of `block_values` consecutive values (along a row), each stored in
// `block_bytes` bytes; scales are IEEE f16. Decoders reproduce the reference `gguf` Python
// package bit for bit (same float32 operation order; this file is compiled without FMA
// contraction, see CMakeLists.txt). Written from the format description, not from ggml's code.
#pragma once
#include <cstdint>

#include "corelm/gguf.h"

namespace corelm::io {

struct GGMLTypeInfo {
  GGMLType type;
  const char* name;
  int64_t block_values;  // 1 for the plain float types
  uint64_t block_bytes;  // bytes per block (per value for the plain float types)
  // Block codecs: `n_blocks` whole blocks; nullptr for the plain float types (and, for encode,
  // for types corelm reads but does not write: Q2_K, Q3_K).
  void (*decode)(const uint8_t* in, int64_t n_blocks, float* out);
  void (*encode)(const float* in, int64_t n_blocks, uint8_t* out);
};

// nullptr for a type number this reader does not know.
const GGMLTypeInfo* ggml_type_info(uint32_t type);
const GGMLTypeInfo& ggml_type_info(GGMLType type);  // a known enumerator
// "F32=0, F16=1, Q4_0=2, ..." for error messages.
const char* ggml_supported_types();

// Per-type block codecs, exposed for tests (n_blocks whole blocks).
void decode_q4_1(const uint8_t* in, int64_t n_blocks, float* out);
void decode_q5_0(const uint8_t* in, int64_t n_blocks, float* out);
void decode_q5_1(const uint8_t* in, int64_t n_blocks, float* out);
void decode_q2_k(const uint8_t* in, int64_t n_blocks, float* out);
void decode_q3_k(const uint8_t* in, int64_t n_blocks, float* out);
void decode_q4_k(const uint8_t* in, int64_t n_blocks, float* out);
void decode_q5_k(const uint8_t* in, int64_t n_blocks, float* out);
void decode_q6_k(const uint8_t* in, int64_t n_blocks, float* out);
void encode_q4_1(const float* in, int64_t n_blocks, uint8_t* out);
void encode_q5_0(const float* in, int64_t n_blocks, uint8_t* out);
void encode_q5_1(const float* in, int64_t n_blocks, uint8_t* out);
void encode_q4_k(const float* in, int64_t n_blocks, uint8_t* out);
void encode_q5_k(const float* in, int64_t n_blocks, uint8_t* out);
void encode_q6_k(const float* in, int64_t n_blocks, uint8_t* out);

}  // namespace corelm::io
