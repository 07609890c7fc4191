// GGUF reader (mmap + full validation) and atomic writer. Layout reference: ggml's gguf spec
// (docs/gguf.md in ggml/llama.cpp); written from the spec, not from its code.
#include "corelm/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "corelm/error.h"
#include "corelm/utf8.h"
#include "io/atomic_writer.h"
#include "io/ggml_quants.h"

namespace corelm::io {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

namespace {

constexpr uint32_t kMaxDims = 4;
// Arrays of arrays are legal but unused in practice; the bound stops a crafted file from
// recursing without end. Element counts are bounded by the bytes left in the file.
constexpr uint64_t kMaxArrayNesting = 4;

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GGUFType::Float64); }
bool known_ggml_type(uint32_t t) { return ggml_type_info(t) != nullptr; }

size_t scalar_size(GGUFType t) {
  switch (t) {
    case GGUFType::Uint8: case GGUFType::Int8: case GGUFType::Bool: return 1;
    case GGUFType::Uint16: case GGUFType::Int16: return 2;
    case GGUFType::Uint32: case GGUFType::Int32: case GGUFType::Float32: return 4;
    case GGUFType::Uint64: case GGUFType::Int64: case GGUFType::Float64: return 8;
    default: return 0;
  }
}
bool is_unsigned(GGUFType t) {
  return t == GGUFType::Uint8 || t == GGUFType::Uint16 || t == GGUFType::Uint32 || t == GGUFType::Uint64;
}

// Bounds-checked cursor over the mapped bytes; every failure names the file and what was read.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& path) : base_(base), size_(size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  void need(uint64_t n, const std::string& what) const {
    CORELM_CHECK(n <= left(), FormatError, "GGUF '", path_, "': truncated while reading ", what, " (needs ", n,
                 " bytes at offset ", pos_, ", file is ", size_, " bytes)");
  }
  template <typename T> T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  void skip(uint64_t n) { pos_ += n; }
  std::string string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " length");
    need(n, what + " (length " + std::to_string(n) + ")");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_, pos_ = 0;
  const std::string& path_;
};

// Element-type phrases for errors: "uint8", "string", "array of int32".
std::string type_phrase(GGUFType t, GGUFType element) {
  if (t == GGUFType::Array) return std::string("array of ") + gguf_type_name(element);
  return gguf_type_name(t);
}

void put_value(std::string& out, const GGUFValue& v) {
  auto put = [&](const auto& x) { out.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  switch (v.type) {
    case GGUFType::Uint8: put(static_cast<uint8_t>(v.u)); break;
    case GGUFType::Uint16: put(static_cast<uint16_t>(v.u)); break;
    case GGUFType::Uint32: put(static_cast<uint32_t>(v.u)); break;
    case GGUFType::Uint64: put(static_cast<uint64_t>(v.u)); break;
    case GGUFType::Int8: put(static_cast<int8_t>(v.i)); break;
    case GGUFType::Int16: put(static_cast<int16_t>(v.i)); break;
    case GGUFType::Int32: put(static_cast<int32_t>(v.i)); break;
    case GGUFType::Int64: put(static_cast<int64_t>(v.i)); break;
    case GGUFType::Bool: put(static_cast<uint8_t>(v.i != 0)); break;
    case GGUFType::Float32: put(static_cast<float>(v.f)); break;
    case GGUFType::Float64: put(static_cast<double>(v.f)); break;
    case GGUFType::String: put(static_cast<uint64_t>(v.s.size())); out += v.s; break;
    case GGUFType::Array:
      put(static_cast<uint32_t>(v.array.type()));
      put(static_cast<uint64_t>(v.array.size()));
      out += v.array.encoded();
      break;
  }
}

// Validates `n` encoded elements of type `et` at data[pos..size) and moves pos past them,
// recording each element's start (relative to `base`) in `offsets` when given. Nothing is
// allocated per element, so a crafted count costs at most a walk over the file's bytes.
void walk_elements(const uint8_t* data, uint64_t size, uint64_t& pos, GGUFType et, uint64_t n,
                   const std::string& what, int depth, uint64_t base, std::vector<uint64_t>* offsets) {
  auto need = [&](uint64_t bytes, uint64_t k) {
    CORELM_CHECK(bytes <= size - pos, FormatError, what, ": truncated in element ", k, " (needs ", bytes,
                 " bytes at offset ", pos, ", ", size - pos, " left)");
  };
  // Each element takes at least one byte (strings 8, arrays 12): a count the rest of the data
  // cannot hold is corrupt, and refusing it up front bounds the walk.
  const uint64_t min_each = et == GGUFType::String  ? 8
                            : et == GGUFType::Array ? 12
                                                    : std::max<uint64_t>(1, scalar_size(et));
  CORELM_CHECK(n <= (size - pos) / min_each, FormatError, what, " claims ", n, " elements of ",
               gguf_type_name(et), ", more than the remaining ", size - pos, " bytes can hold");
  if (et != GGUFType::String && et != GGUFType::Array) {
    const uint64_t bytes = n * scalar_size(et);
    if (et == GGUFType::Bool)
      for (uint64_t k = 0; k < n; ++k)
        CORELM_CHECK(data[pos + k] <= 1, FormatError, what, "[", k, "] is a bool with byte value ",
                     int(data[pos + k]));
    pos += bytes;
    return;
  }
  if (offsets) offsets->reserve(n);
  for (uint64_t k = 0; k < n; ++k) {
    if (offsets) offsets->push_back(pos - base);
    if (et == GGUFType::String) {
      need(8, k);
      uint64_t len;
      std::memcpy(&len, data + pos, 8);
      pos += 8;
      need(len, k);
      pos += len;
    } else {
      CORELM_CHECK(depth + 1 < static_cast<int>(kMaxArrayNesting), FormatError, what, " nests arrays deeper than ",
                   kMaxArrayNesting);
      need(12, k);
      uint32_t inner;
      uint64_t count;
      std::memcpy(&inner, data + pos, 4);
      std::memcpy(&count, data + pos + 4, 8);
      pos += 12;
      const std::string inner_what = what + "[" + std::to_string(k) + "]";
      CORELM_CHECK(known_value_type(inner), FormatError, inner_what, " has unknown element type ", inner);
      walk_elements(data, size, pos, static_cast<GGUFType>(inner), count, inner_what, depth + 1, base, nullptr);
    }
  }
}

// One metadata value. `what` ("metadata 'key'") names it in the cursor's truncation errors;
// `where` ("GGUF 'file': metadata 'key'") prefixes every other error about it, then and later.
GGUFValue read_value(Cursor& c, const uint8_t* base, uint64_t size, GGUFType type, const std::string& path,
                     const std::string& key) {
  const std::string what = "metadata '" + escape_invalid_utf8(key) + "'", where = "GGUF '" + path + "': " + what;
  GGUFValue v;
  v.type = type;
  v.where = where;
  switch (type) {
    case GGUFType::Uint8: v.u = c.read<uint8_t>(what); break;
    case GGUFType::Uint16: v.u = c.read<uint16_t>(what); break;
    case GGUFType::Uint32: v.u = c.read<uint32_t>(what); break;
    case GGUFType::Uint64: v.u = c.read<uint64_t>(what); break;
    case GGUFType::Int8: v.i = c.read<int8_t>(what); break;
    case GGUFType::Int16: v.i = c.read<int16_t>(what); break;
    case GGUFType::Int32: v.i = c.read<int32_t>(what); break;
    case GGUFType::Int64: v.i = c.read<int64_t>(what); break;
    case GGUFType::Bool: {
      const uint8_t b = c.read<uint8_t>(what);
      CORELM_CHECK(b <= 1, FormatError, where, " is a bool with byte value ", int(b));
      v.i = b;
      break;
    }
    case GGUFType::Float32: v.f = c.read<float>(what); break;
    case GGUFType::Float64: v.f = c.read<double>(what); break;
    case GGUFType::String: v.s = c.string(what); break;
    case GGUFType::Array: {
      const uint32_t et = c.read<uint32_t>(what + " element type");
      CORELM_CHECK(known_value_type(et), FormatError, where, " has unknown element type ", et);
      const uint64_t n = c.read<uint64_t>(what + " element count");
      uint64_t pos = c.pos();
      v.array = GGUFArray::decode(base, size, pos, static_cast<GGUFType>(et), n, where, 0);
      c.skip(pos - c.pos());
      break;
    }
  }
  return v;
}

void put_string(std::string& out, const std::string& s) {
  const uint64_t n = s.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += s;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

const char* gguf_type_name(GGUFType t) {
  static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                "bool", "string", "array", "uint64", "int64", "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "unknown";
}

const char* ggml_type_name(GGMLType t) {
  const GGMLTypeInfo* i = ggml_type_info(static_cast<uint32_t>(t));
  return i ? i->name : "unknown";
}

int64_t ggml_block_size(GGMLType t) {
  const GGMLTypeInfo* i = ggml_type_info(static_cast<uint32_t>(t));
  return i ? i->block_values : 1;
}

bool ggml_can_write(GGMLType t) {
  const GGMLTypeInfo* i = ggml_type_info(static_cast<uint32_t>(t));
  return i && (i->block_values == 1 || i->encode != nullptr);
}

uint64_t ggml_nbytes(GGMLType t, int64_t numel) {
  const GGMLTypeInfo* i = ggml_type_info(static_cast<uint32_t>(t));
  if (!i) return 0;
  return static_cast<uint64_t>(numel) / static_cast<uint64_t>(i->block_values) * i->block_bytes;
}

GGMLType ggml_type_from_name(const std::string& name) {
  std::string upper = name;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (uint32_t t = 0; t < 64; ++t)
    if (const GGMLTypeInfo* i = ggml_type_info(t); i && upper == i->name) return i->type;
  throw ValueError("unknown ggml type '" + name + "' (known: " + ggml_supported_types() + ")");
}

// ---- arrays ---------------------------------------------------------------------------------

namespace {

bool is_integer(GGUFType t) { return scalar_size(t) > 0 && t != GGUFType::Float32 && t != GGUFType::Float64; }
bool is_numeric(GGUFType t) { return scalar_size(t) > 0; }

// A value read from a file is at fault: FormatError prefixed by its `where` (file and key). One
// built in memory (empty `where`) is the caller's: ValueError.
[[noreturn]] void fail(const std::string& where, const std::string& message) {
  if (where.empty()) throw ValueError("GGUF value" + message);
  throw FormatError(where + message);
}
[[noreturn]] void type_error(const std::string& where, const std::string& actual, const std::string& expected) {
  fail(where, " is " + actual + ", expected " + expected);
}

template <typename T> T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

std::string GGUFArray::describe() const { return where_.empty() ? "GGUF array" : where_; }

void GGUFArray::check_index(size_t k) const {
  CORELM_CHECK(k < n_, IndexError, describe(), ": index ", k, " is outside its ", n_, " elements");
}

uint64_t GGUFArray::start_of(size_t k) const {
  return type_ == GGUFType::String || type_ == GGUFType::Array ? offsets_[k] : k * scalar_size(type_);
}

GGUFArray GGUFArray::decode(const uint8_t* data, uint64_t size, uint64_t& pos, GGUFType et, uint64_t n,
                            const std::string& what, int depth) {
  GGUFArray a(et);
  const uint64_t start = pos;
  walk_elements(data, size, pos, et, n, what, depth, start, &a.offsets_);
  a.n_ = n;
  a.bytes_.assign(reinterpret_cast<const char*>(data + start), pos - start);
  a.where_ = what;
  return a;
}

int64_t GGUFArray::int_at(size_t k) const {
  if (!is_integer(type_))
    type_error(where_, "an array of " + std::string(gguf_type_name(type_)), "an array of integers");
  check_index(k);
  const char* p = bytes_.data() + start_of(k);
  switch (type_) {
    case GGUFType::Uint8: case GGUFType::Bool: return load<uint8_t>(p);
    case GGUFType::Int8: return load<int8_t>(p);
    case GGUFType::Uint16: return load<uint16_t>(p);
    case GGUFType::Int16: return load<int16_t>(p);
    case GGUFType::Uint32: return load<uint32_t>(p);
    case GGUFType::Int32: return load<int32_t>(p);
    case GGUFType::Int64: return load<int64_t>(p);
    case GGUFType::Uint64: {
      const auto u = load<uint64_t>(p);
      if (u > static_cast<uint64_t>(INT64_MAX))
        fail(where_, "[" + std::to_string(k) + "] = " + std::to_string(u) + " is more than an int64 can hold");
      return static_cast<int64_t>(u);
    }
    default: break;
  }
  return 0;  // unreachable: is_integer above
}

double GGUFArray::float_at(size_t k) const {
  if (!is_numeric(type_))
    type_error(where_, "an array of " + std::string(gguf_type_name(type_)), "an array of numbers");
  check_index(k);
  const char* p = bytes_.data() + start_of(k);
  if (type_ == GGUFType::Float32) return load<float>(p);
  if (type_ == GGUFType::Float64) return load<double>(p);
  if (type_ == GGUFType::Uint64) return static_cast<double>(load<uint64_t>(p));  // any size as a double
  return static_cast<double>(int_at(k));
}

std::string_view GGUFArray::string_at(size_t k) const {
  if (type_ != GGUFType::String)
    type_error(where_, "an array of " + std::string(gguf_type_name(type_)), "an array of strings");
  check_index(k);
  const char* p = bytes_.data() + offsets_[k];
  return {p + 8, static_cast<size_t>(load<uint64_t>(p))};
}

GGUFArray GGUFArray::array_at(size_t k) const {
  if (type_ != GGUFType::Array)
    type_error(where_, "an array of " + std::string(gguf_type_name(type_)), "an array of arrays");
  check_index(k);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes_.data());
  uint64_t pos = offsets_[k];
  const auto et = static_cast<GGUFType>(load<uint32_t>(bytes_.data() + pos));
  const auto n = load<uint64_t>(bytes_.data() + pos + 4);
  pos += 12;
  // Validated when read; decoding again only re-derives the element offsets.
  GGUFArray inner = decode(data, bytes_.size(), pos, et, n, describe() + "[" + std::to_string(k) + "]", 0);
  if (where_.empty()) inner.where_.clear();
  return inner;
}

GGUFValue GGUFArray::operator[](size_t k) const {
  check_index(k);
  GGUFValue v;
  v.type = type_;
  if (!where_.empty()) v.where = where_ + "[" + std::to_string(k) + "]";
  const char* p = bytes_.data() + start_of(k);
  switch (type_) {
    case GGUFType::String: v.s = std::string(string_at(k)); break;
    case GGUFType::Array: v.array = array_at(k); break;
    case GGUFType::Float32: v.f = load<float>(p); break;
    case GGUFType::Float64: v.f = load<double>(p); break;
    case GGUFType::Uint64: v.u = load<uint64_t>(p); break;
    default:
      if (is_unsigned(type_)) v.u = static_cast<uint64_t>(int_at(k));
      else v.i = int_at(k);
  }
  return v;
}

GGUFValue GGUFArray::const_iterator::operator*() const { return (*a_)[k_]; }

std::vector<int64_t> GGUFArray::ints() const {
  std::vector<int64_t> out(size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = int_at(k);
  if (out.empty() && !is_integer(type_)) int_at(0);  // the type error, even when empty
  return out;
}

std::vector<double> GGUFArray::floats() const {
  std::vector<double> out(size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = float_at(k);
  if (out.empty() && !is_numeric(type_)) float_at(0);
  return out;
}

std::vector<std::string> GGUFArray::strings() const {
  std::vector<std::string> out(size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = std::string(string_at(k));
  if (out.empty() && type_ != GGUFType::String) string_at(0);
  return out;
}

void GGUFArray::push_back(const GGUFValue& v) {
  CORELM_CHECK(v.type == type_, ValueError, describe(), ": an array of ", gguf_type_name(type_), " cannot hold a ",
               gguf_type_name(v.type));
  if (type_ == GGUFType::String || type_ == GGUFType::Array) offsets_.push_back(bytes_.size());
  put_value(bytes_, v);
  ++n_;
}

bool GGUFArray::operator==(const GGUFArray& o) const { return type_ == o.type_ && n_ == o.n_ && bytes_ == o.bytes_; }

// ---- values ---------------------------------------------------------------------------------

GGUFValue GGUFValue::of(GGUFType t, int64_t x) {
  GGUFValue v;
  v.type = t;
  CORELM_CHECK(is_integer(t), ValueError, "GGUFValue::of: ", gguf_type_name(t), " is not an integer or bool type");
  if (is_unsigned(t)) v.u = static_cast<uint64_t>(x);
  else v.i = t == GGUFType::Bool ? (x != 0) : x;
  return v;
}
GGUFValue GGUFValue::of_float(GGUFType t, double x) {
  CORELM_CHECK(t == GGUFType::Float32 || t == GGUFType::Float64, ValueError, "GGUFValue::of_float: ",
               gguf_type_name(t), " is not a float type");
  GGUFValue v;
  v.type = t;
  v.f = t == GGUFType::Float32 ? static_cast<double>(static_cast<float>(x)) : x;
  return v;
}
GGUFValue GGUFValue::of_string(std::string x) {
  GGUFValue v;
  v.type = GGUFType::String;
  v.s = std::move(x);
  return v;
}
GGUFValue GGUFValue::of_array(GGUFArray values) {
  GGUFValue v;
  v.type = GGUFType::Array;
  v.array = std::move(values);
  return v;
}
GGUFValue GGUFValue::of_array(GGUFType et, const std::vector<GGUFValue>& values) {
  GGUFArray a(et);
  for (const auto& e : values) a.push_back(e);
  return of_array(std::move(a));
}
GGUFValue GGUFValue::of_strings(const std::vector<std::string>& values) {
  GGUFArray a(GGUFType::String);
  for (const auto& s : values) a.push_back(of_string(s));
  return of_array(std::move(a));
}
GGUFValue GGUFValue::of_ints(GGUFType et, const std::vector<int64_t>& values) {
  GGUFArray a(et);
  for (int64_t x : values) a.push_back(of(et, x));
  return of_array(std::move(a));
}
int64_t GGUFValue::as_int() const {
  if (!is_integer(type)) type_error(where, type_phrase(type, array.type()), "an integer");
  // Wrapping 2^64 - 1 to -1 would pass for a valid id or size further on: refused by name.
  if (type == GGUFType::Uint64 && u > static_cast<uint64_t>(INT64_MAX))
    fail(where, " = " + std::to_string(u) + " is more than an int64 can hold");
  return is_unsigned(type) ? static_cast<int64_t>(u) : i;
}
int64_t GGUFValue::as_int(int64_t lo, int64_t hi) const {
  const int64_t x = as_int();
  if (x < lo || x > hi)
    fail(where, " = " + std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}
double GGUFValue::as_float() const {
  if (type == GGUFType::Float32 || type == GGUFType::Float64) return f;
  if (!is_numeric(type)) type_error(where, type_phrase(type, array.type()), "a number");
  if (type == GGUFType::Uint64) return static_cast<double>(u);
  return static_cast<double>(as_int());
}
const std::string& GGUFValue::as_string() const {
  if (type != GGUFType::String) type_error(where, type_phrase(type, array.type()), "a string");
  return s;
}
bool GGUFValue::as_bool() const {
  if (!is_integer(type)) type_error(where, type_phrase(type, array.type()), "a bool");
  return is_unsigned(type) ? u != 0 : i != 0;
}
const GGUFArray& GGUFValue::as_array() const {
  if (type != GGUFType::Array) type_error(where, type_phrase(type, array.type()), "an array");
  return array;
}
const GGUFArray& GGUFValue::as_array(GGUFType et) const {
  if (type != GGUFType::Array || array.type() != et)
    type_error(where, type_phrase(type, array.type()), std::string("an array of ") + gguf_type_name(et));
  return array;
}
bool GGUFValue::operator==(const GGUFValue& o) const {
  if (type != o.type) return false;
  if (type == GGUFType::Array) return array == o.array;
  if (type == GGUFType::String) return s == o.s;
  if (type == GGUFType::Float32 || type == GGUFType::Float64) return f == o.f || (std::isnan(f) && std::isnan(o.f));
  if (type == GGUFType::Uint64) return u == o.u;
  return as_int() == o.as_int();
}

Shape GGUFTensorInfo::shape() const { return Shape(ne.rbegin(), ne.rend()); }

// ---- reader ---------------------------------------------------------------------------------

GGUFFile GGUFFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IOError("cannot open GGUF file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IOError("'" + path + "' is not a regular file");
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 24) {
    ::close(fd);
    throw FormatError("GGUF '" + path + "': file is " + std::to_string(file_size) +
                      " bytes, too short for the 24-byte header (truncated?)");
  }
  void* addr = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) throw IOError("cannot mmap '" + path + "': " + std::strerror(map_err));
  std::shared_ptr<void> keep(addr, [file_size](void* p) { ::munmap(p, file_size); });

  GGUFFile f;
  f.path_ = path;
  f.mapping_ = Storage::wrap(addr, file_size, keep);
  Cursor c(static_cast<const uint8_t*>(addr), file_size, f.path_);
  const auto magic = c.read<uint32_t>("magic");
  CORELM_CHECK(std::memcmp(&magic, "GGUF", 4) == 0, FormatError, "GGUF '", path,
               "': bad magic (not a GGUF file)");
  f.version_ = c.read<uint32_t>("version");
  CORELM_CHECK(f.version_ == 2 || f.version_ == 3, FormatError, "GGUF '", path, "': unsupported version ",
               f.version_, " (supported: 2, 3)");
  const auto n_tensors = c.read<uint64_t>("tensor count");
  const auto n_kv = c.read<uint64_t>("metadata count");
  // A key/value takes at least 8 + 4 + 1 bytes and a tensor info at least 8 + 4 + 8 + 4 + 8.
  CORELM_CHECK(n_kv <= c.left() / 13, FormatError, "GGUF '", path, "': metadata count ", n_kv,
               " is more than the file's ", file_size, " bytes can hold (truncated or corrupt)");
  CORELM_CHECK(n_tensors <= c.left() / 32, FormatError, "GGUF '", path, "': tensor count ", n_tensors,
               " is more than the file's ", file_size, " bytes can hold (truncated or corrupt)");

  std::set<std::string> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string what = "metadata key #" + std::to_string(k);
    std::string key = c.string(what);
    // Names from the file are bytes: shown with invalid UTF-8 escaped, as messages may end up in JSON.
    const std::string shown = escape_invalid_utf8(key);
    const auto t = c.read<uint32_t>("type of metadata '" + shown + "'");
    CORELM_CHECK(known_value_type(t), FormatError, "GGUF '", path, "': metadata '", shown, "' has unknown type ", t);
    CORELM_CHECK(keys.insert(key).second, FormatError, "GGUF '", path, "': duplicate metadata key '", shown, "'");
    GGUFValue v = read_value(c, static_cast<const uint8_t*>(addr), file_size, static_cast<GGUFType>(t), path, key);
    f.metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (const GGUFValue* a = f.find("general.alignment")) {
    CORELM_CHECK(a->type == GGUFType::Uint32 && a->u > 0 && (a->u & (a->u - 1)) == 0, FormatError, "GGUF '", path,
                 "': general.alignment must be a power-of-two uint32, got ", gguf_type_name(a->type), " ",
                 a->as_float());
    f.alignment_ = a->u;
  }

  std::set<std::string> names;
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GGUFTensorInfo info;
    info.name = c.string("name of tensor #" + std::to_string(k));
    const std::string shown = escape_invalid_utf8(info.name);
    const std::string w = "GGUF '" + path + "': tensor '" + shown + "': ";
    CORELM_CHECK(names.insert(info.name).second, FormatError, w, "duplicate tensor name");
    const auto n_dims = c.read<uint32_t>("n_dims of tensor '" + shown + "'");
    CORELM_CHECK(n_dims >= 1 && n_dims <= kMaxDims, FormatError, w, n_dims, " dimensions (1..", kMaxDims, " allowed)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = c.read<uint64_t>("dims of tensor '" + shown + "'");
      // The densest type (Q2_K) stores 256 values in 84 bytes: more than 4 values per file byte
      // is impossible, and the bound keeps numel (and the bytes it implies) far from overflow.
      CORELM_CHECK(ne > 0 && ne <= file_size * 4 && numel <= (file_size * 4) / ne, FormatError, w, "dimension ", d,
                   " = ", ne, " is impossible for a ", file_size, "-byte file");
      numel *= ne;
      info.ne.push_back(static_cast<int64_t>(ne));
    }
    const auto t = c.read<uint32_t>("type of tensor '" + shown + "'");
    CORELM_CHECK(known_ggml_type(t), FormatError, w, "unsupported ggml type ", t, " (supported: ",
                 ggml_supported_types(), ")");
    info.type = static_cast<GGMLType>(t);
    // Blocks run along rows: a row length the block does not divide has no valid encoding.
    CORELM_CHECK(info.ne[0] % ggml_block_size(info.type) == 0, FormatError, w, "row length (first dimension) ",
                 info.ne[0], " is not a multiple of the ", ggml_type_name(info.type), " block size ",
                 ggml_block_size(info.type));
    info.offset = c.read<uint64_t>("offset of tensor '" + shown + "'");
    CORELM_CHECK(info.offset % f.alignment_ == 0, FormatError, w, "offset ", info.offset,
                 " is not a multiple of the alignment ", f.alignment_);
    info.nbytes = ggml_nbytes(info.type, static_cast<int64_t>(numel));
    f.tensors_.push_back(std::move(info));
  }
  f.data_start_ = align_up(c.pos(), f.alignment_);
  const uint64_t data_size = file_size >= f.data_start_ ? file_size - f.data_start_ : 0;
  CORELM_CHECK(f.tensors_.empty() || file_size >= f.data_start_, FormatError, "GGUF '", path,
               "': truncated before the data section (", file_size, " bytes, data would start at ", f.data_start_,
               ")");
  // Sorted by offset, each tensor must fit in the data section and not overlap the next.
  std::vector<const GGUFTensorInfo*> order;
  for (const auto& t : f.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& t = *order[k];
    CORELM_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset, FormatError, "GGUF '", path,
                 "': tensor '", escape_invalid_utf8(t.name), "' (", ggml_type_name(t.type), ", ", t.nbytes, " bytes at data offset ",
                 t.offset, ") runs past the end of the file (data section is ", data_size, " bytes; truncated?)");
    if (k + 1 < order.size())
      CORELM_CHECK(t.offset + t.nbytes <= order[k + 1]->offset, FormatError, "GGUF '", path, "': tensor '",
                   escape_invalid_utf8(t.name), "' overlaps tensor '", escape_invalid_utf8(order[k + 1]->name), "'");
  }
  return f;
}

const GGUFValue* GGUFFile::find(const std::string& key) const {
  for (const auto& [k, v] : metadata_)
    if (k == key) return &v;
  return nullptr;
}

const GGUFValue& GGUFFile::at(const std::string& key) const {
  const GGUFValue* v = find(key);
  CORELM_CHECK(v != nullptr, IndexError, "GGUF '", path_, "': no metadata key '", key, "'");
  return *v;
}

const GGUFTensorInfo& GGUFFile::info(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw IndexError("GGUF '" + path_ + "': no tensor named '" + name + "'");
}

Tensor GGUFFile::get(const std::string& name) const {
  const GGUFTensorInfo& t = info(name);
  const uint64_t byte_off = data_start_ + t.offset;
  const auto* src = static_cast<const uint8_t*>(mapping_->data()) + byte_off;
  const Shape shape = t.shape();
  int64_t numel = 1;
  for (auto d : t.ne) numel *= d;
  auto view_or_copy = [&](DType dt) {
    const size_t es = dtype_size(dt);
    if (byte_off % es == 0) return Tensor::from_storage(mapping_, shape, dt, static_cast<int64_t>(byte_off / es));
    Tensor out = Tensor::empty(shape, dt);
    std::memcpy(out.raw_data(), src, t.nbytes);
    return out;
  };
  switch (t.type) {
    case GGMLType::F32: return view_or_copy(DType::F32);
    case GGMLType::F16: return view_or_copy(DType::F16);
    case GGMLType::BF16: return view_or_copy(DType::BF16);
    default: break;
  }
  // A block type: sizes were checked when the file was opened (rows whole blocks, bytes inside
  // the data section), so decoding numel / block whole blocks stays inside the mapping.
  const GGMLTypeInfo& q = ggml_type_info(t.type);
  CORELM_CHECK(q.decode != nullptr && numel % q.block_values == 0 &&
                   t.nbytes == static_cast<uint64_t>(numel / q.block_values) * q.block_bytes,
               FormatError, "GGUF '", path_, "': tensor '", escape_invalid_utf8(name), "' (", q.name,
               ") cannot be decoded: ", numel, " values, ", t.nbytes, " bytes");
  Tensor out = Tensor::empty(shape);
  q.decode(src, numel / q.block_values, out.data<float>());
  return out;
}

// ---- writer ---------------------------------------------------------------------------------

void save_gguf(const std::string& path, const std::vector<std::pair<std::string, GGUFValue>>& metadata,
               const std::vector<GGUFWriteTensor>& tensors) {
  uint64_t alignment = 32;
  std::set<std::string> keys, names;
  for (const auto& [k, v] : metadata) {
    CORELM_CHECK(keys.insert(k).second, ValueError, "save_gguf '", path, "': duplicate metadata key '", k, "'");
    if (k == "general.alignment") {
      CORELM_CHECK(v.type == GGUFType::Uint32 && v.u > 0 && (v.u & (v.u - 1)) == 0, ValueError, "save_gguf '", path,
                   "': general.alignment must be a power-of-two uint32");
      alignment = v.u;
    }
  }
  std::string header("GGUF", 4);
  auto put = [&](const auto& x) { header.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  put(uint32_t{3});
  put(static_cast<uint64_t>(tensors.size()));
  put(static_cast<uint64_t>(metadata.size()));
  for (const auto& [k, v] : metadata) {
    put_string(header, k);
    put(static_cast<uint32_t>(v.type));
    put_value(header, v);
  }
  // Tensor data, each converted to its ggml type and placed at an aligned offset.
  std::vector<std::string> blobs;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string w = "save_gguf '" + path + "': tensor '" + t.name + "': ";
    CORELM_CHECK(names.insert(t.name).second, ValueError, w, "duplicate name");
    CORELM_CHECK(t.value.defined() && t.value.dim() >= 1 && t.value.dim() <= static_cast<int64_t>(kMaxDims),
                 ValueError, w, "needs 1..4 dimensions");
    const int64_t n = t.value.numel(), last = t.value.size(-1);
    CORELM_CHECK(ggml_can_write(t.type), ValueError, w, "corelm cannot write ggml type ", ggml_type_name(t.type),
                 " (it reads it)");
    const int64_t block = ggml_block_size(t.type);
    CORELM_CHECK(last % block == 0, ValueError, w, "last dimension ", last, " is not a multiple of the ",
                 ggml_type_name(t.type), " block size ", block);
    std::string blob(ggml_nbytes(t.type, n), '\0');
    auto* dst = reinterpret_cast<uint8_t*>(blob.data());
    auto copy_as = [&](DType dt) {
      Tensor c = t.value.to(dt).contiguous();
      std::memcpy(dst, c.raw_data(), blob.size());
    };
    switch (t.type) {
      case GGMLType::F32: copy_as(DType::F32); break;
      case GGMLType::F16: copy_as(DType::F16); break;
      case GGMLType::BF16: copy_as(DType::BF16); break;
      default:
        ggml_type_info(t.type).encode(t.value.to(DType::F32).contiguous().data<float>(), n / block, dst);
    }
    put_string(header, t.name);
    put(static_cast<uint32_t>(t.value.dim()));
    for (int64_t d = t.value.dim() - 1; d >= 0; --d) put(static_cast<uint64_t>(t.value.size(d)));
    put(static_cast<uint32_t>(t.type));
    put(offset);
    offset = align_up(offset + blob.size(), alignment);
    blobs.push_back(std::move(blob));
  }
  header.resize(align_up(header.size(), alignment), '\0');
  AtomicWriter out(path);
  out.write(header);
  for (auto& b : blobs) {
    b.resize(align_up(b.size(), alignment), '\0');
    out.write(b);
  }
  out.commit();
}

}  // namespace corelm::io
