// GGUF (llama.cpp's file format), versions 2 and 3, little-endian: "GGUF", u32 version,
// u64 tensor count, u64 metadata count, metadata key/values, tensor infos (name, dims with the
// fastest-varying first, ggml type, offset into the data section), padding to the alignment
// (general.alignment, default 32), then the data section. The reader memory-maps the file and
// validates everything (counts and string lengths bounded by the file, known types, aligned
// offsets, tensor bytes inside the file) before returning; every error names the file and the
// key or tensor concerned.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "corelm/tensor.h"

namespace corelm::io {

enum class GGUFType : uint32_t {
  Uint8 = 0, Int8 = 1, Uint16 = 2, Int16 = 3, Uint32 = 4, Int32 = 5, Float32 = 6, Bool = 7,
  String = 8, Array = 9, Uint64 = 10, Int64 = 11, Float64 = 12,
};
const char* gguf_type_name(GGUFType t);

// ggml tensor types this reader knows: the plain float types, llama.cpp's legacy block types
// (blocks of 32 values with f16 scales) and its k-quants (blocks of 256 values in sub-blocks with
// small integer scales). Block types are dequantised to f32 on read; all but Q2_K/Q3_K can be
// written (src/io/ggml_quants.h describes each layout).
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};
const char* ggml_type_name(GGMLType t);
int64_t ggml_block_size(GGMLType t);  // values per block: 1 for F32/F16/BF16, 32 or 256
bool ggml_can_write(GGMLType t);      // save_gguf can quantise to it
uint64_t ggml_nbytes(GGMLType t, int64_t numel);  // numel a multiple of ggml_block_size(t)
// "q4_k" -> Q4_K (any case); ValueError listing the names when unknown.
GGMLType ggml_type_from_name(const std::string& name);

struct GGUFValue;

// An array value. Its elements stay in their GGUF encoding (numbers little-endian, strings as a
// u64 length + bytes, nested arrays as element type + count + elements), validated once when
// read, plus the start offset of each element when elements vary in size. So an array costs
// about its own bytes in the file; one object per element cost ~165x (issue 13: a 17.8 MB file
// holding a 16M-element uint8 array took 2.9 GB). Element accessors check the element type and
// name the file, key and index in the error when the array was read from a file.
class GGUFArray {
 public:
  GGUFArray() = default;
  explicit GGUFArray(GGUFType element_type) : type_(element_type) {}

  GGUFType type() const { return type_; }  // the element type
  size_t size() const { return static_cast<size_t>(n_); }
  bool empty() const { return n_ == 0; }

  int64_t int_at(size_t k) const;           // integer and bool elements
  double float_at(size_t k) const;          // any numeric element
  std::string_view string_at(size_t k) const;
  GGUFArray array_at(size_t k) const;       // a nested array, decoded on access
  GGUFValue operator[](size_t k) const;     // one element as a value, for generic code

  // The whole array, converted; FormatError/ValueError naming the key when the element type
  // does not fit (ints: integer or bool elements; floats: any numeric; strings: strings).
  std::vector<int64_t> ints() const;
  std::vector<double> floats() const;
  std::vector<std::string> strings() const;

  void push_back(const GGUFValue& v);  // appends v, encoded; ValueError unless v.type == type()

  // Iteration yields elements by value (as operator[]).
  class const_iterator {
   public:
    using value_type = GGUFValue;
    using difference_type = std::ptrdiff_t;
    const_iterator(const GGUFArray* a, size_t k) : a_(a), k_(k) {}
    GGUFValue operator*() const;
    const_iterator& operator++() { ++k_; return *this; }
    bool operator==(const const_iterator& o) const { return k_ == o.k_; }
    bool operator!=(const const_iterator& o) const { return k_ != o.k_; }
   private:
    const GGUFArray* a_;
    size_t k_;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }

  bool operator==(const GGUFArray& o) const;  // same element type and the same encoded elements

  // "GGUF 'file': metadata 'key'" for an array read from a file (empty when built in memory):
  // the prefix of every error about it.
  const std::string& where() const { return where_; }
  void set_where(std::string w) { where_ = std::move(w); }
  const std::string& encoded() const { return bytes_; }  // the elements as stored in GGUF

  // Reads `n` elements of `element_type` at the cursor position of `data` (bounds, bool bytes,
  // nested element types and `depth` checked: FormatError naming `what`). Used by the reader.
  static GGUFArray decode(const uint8_t* data, uint64_t size, uint64_t& pos, GGUFType element_type, uint64_t n,
                          const std::string& what, int depth);

 private:
  std::string describe() const;  // where_ or "GGUF array"
  void check_index(size_t k) const;
  uint64_t start_of(size_t k) const;  // byte offset of element k in bytes_

  GGUFType type_ = GGUFType::Uint8;
  uint64_t n_ = 0;
  std::string bytes_;
  std::vector<uint64_t> offsets_;  // element starts, for string and array elements only
  std::string where_;
};

// One metadata value. Integers are kept in `i` (signed types and bool) or `u` (unsigned types),
// floats in `f`, strings in `s`, arrays in `array`. The conversions check the type and, for a
// value read from a file, name the file and key (`where`) and the expected and actual types.
struct GGUFValue {
  GGUFType type = GGUFType::Uint32;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  GGUFArray array;
  std::string where;  // "GGUF 'file': metadata 'key'" when read from a file, else empty

  static GGUFValue of(GGUFType t, int64_t signed_or_unsigned);  // integer types and Bool
  static GGUFValue of_float(GGUFType t, double v);             // Float32 / Float64
  static GGUFValue of_string(std::string v);
  static GGUFValue of_array(GGUFType element_type, const std::vector<GGUFValue>& values);
  static GGUFValue of_array(GGUFArray values);
  static GGUFValue of_strings(const std::vector<std::string>& values);
  static GGUFValue of_ints(GGUFType element_type, const std::vector<int64_t>& values);

  // Conversions: FormatError (read from a file) or ValueError (built in memory) naming the
  // actual and expected type when it does not fit. as_int refuses uint64 values above
  // INT64_MAX; the ranged form also refuses values outside [lo, hi], naming them.
  int64_t as_int() const;
  int64_t as_int(int64_t lo, int64_t hi) const;
  double as_float() const;  // any numeric type
  const std::string& as_string() const;
  bool as_bool() const;     // bool or integer (non-zero)
  const GGUFArray& as_array() const;                        // an array of any element type
  const GGUFArray& as_array(GGUFType element_type) const;  // an array of that element type
  bool operator==(const GGUFValue& o) const;  // ignores `where`
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
  // block types dequantised into a fresh f32 tensor.
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
// else 32. Block types need the last dimension to be a multiple of their block size (32 or 256;
// ValueError naming the tensor), and a type save_gguf can write (ggml_can_write). Duplicate keys
// or tensor names are ValueErrors.
void save_gguf(const std::string& path, const std::vector<std::pair<std::string, GGUFValue>>& metadata,
               const std::vector<GGUFWriteTensor>& tensors);

// Block (de)quantisation, exposed for tests: n a multiple of 32. The other types' codecs are in
// src/io/ggml_quants.h.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out);
void dequantize_q8_0(const uint8_t* in, int64_t n, float* y);
void quantize_q4_0(const float* x, int64_t n, uint8_t* out);
void dequantize_q4_0(const uint8_t* in, int64_t n, float* y);

// What the tensors of a Llama/Qwen2 GGUF mean (names, architecture keys, the q/k permutation) is
// the model's business: corelm/architecture.h (model::save_gguf_model, model::load_gguf_model).

}  // namespace corelm::io
