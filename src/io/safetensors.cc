// safetensors reader (mmap, whole header validated up front) and atomic writer.
// Format: u64 little-endian header length N, N bytes of JSON, then the data section; each
// tensor's data_offsets are relative to the start of the data section.
#include "corelm/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "corelm/error.h"
#include "io/atomic_writer.h"

namespace corelm::io {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using ojson = nlohmann::ordered_json;

// Headers of real checkpoints are at most a few MB; the bound stops a corrupt length from
// making us parse (or allocate) gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const char* st_dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
  }
  return "?";
}

bool st_dtype_from_name(const std::string& name, DType& out) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::I8, DType::U8}) {
    if (name == st_dtype_name(dt)) {
      out = dt;
      return true;
    }
  }
  return false;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

std::string where(const std::string& path) { return "safetensors '" + path + "': "; }

// Parses and validates the header; throws FormatError naming the file and the tensor/field.
std::vector<Entry> parse_header(const std::string& path, const char* text, size_t len, uint64_t data_bytes,
                                std::map<std::string, std::string>& metadata) {
  const std::string w = where(path);
  // Duplicate top-level keys are silently merged by JSON parsers; reject them instead, since a
  // second "x" could otherwise hide a conflicting first one.
  std::set<std::string> seen;
  std::string duplicate;
  auto cb = [&](int depth, ojson::parse_event_t event, ojson& parsed) {
    if (event == ojson::parse_event_t::key && depth == 1) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  ojson header;
  try {
    header = ojson::parse(text, text + len, cb);
  } catch (const ojson::exception& e) {  // parse_error, and out_of_range for numbers beyond 64 bits
    throw FormatError(w + "header is not valid JSON: " + e.what());
  }
  CORELM_CHECK(duplicate.empty(), FormatError, w, "duplicate tensor '", duplicate, "' in header");
  CORELM_CHECK(header.is_object(), FormatError, w, "header must be a JSON object, got ", header.type_name());

  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const ojson& v = it.value();
    if (name == "__metadata__") {
      CORELM_CHECK(v.is_object(), FormatError, w, "__metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        CORELM_CHECK(m.value().is_string(), FormatError, w, "__metadata__ field '", m.key(),
                     "' must be a string, got ", m.value().type_name());
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string t = w + "tensor '" + name + "': ";
    CORELM_CHECK(v.is_object(), FormatError, t, "entry must be an object");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      CORELM_CHECK(v.contains(field), FormatError, t, "missing field '", field, "'");
    CORELM_CHECK(v["dtype"].is_string(), FormatError, t, "dtype must be a string");
    Entry e;
    e.name = name;
    std::string dt = v["dtype"].get<std::string>();
    CORELM_CHECK(st_dtype_from_name(dt, e.dtype), FormatError, t, "unsupported dtype '", dt,
                 "' (supported: F32, BF16, F16, I32, I64, I8, U8)");
    const ojson& shape = v["shape"];
    CORELM_CHECK(shape.is_array(), FormatError, t, "shape must be an array");
    for (const auto& d : shape) {
      CORELM_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, FormatError, t,
                   "shape entries must be non-negative integers, got ", d.dump());
      e.shape.push_back(d.get<int64_t>());
    }
    // numel * element size, refusing anything past 2^62 bytes (no file is that large, and it
    // keeps the element counts and strides computed later far from int64 overflow).
    constexpr uint64_t kMaxBytes = uint64_t{1} << 62;
    // Zero-sized dims are skipped in the bound so that [0, 2^40, 2^40] is refused too.
    uint64_t nbytes = dtype_size(e.dtype);
    bool too_big = false, empty = false;
    for (int64_t dim : e.shape) {
      if (dim == 0) {
        empty = true;
        continue;
      }
      if (nbytes > kMaxBytes / static_cast<uint64_t>(dim)) {
        too_big = true;
        break;
      }
      nbytes *= static_cast<uint64_t>(dim);
    }
    if (empty) nbytes = 0;
    CORELM_CHECK(!too_big, FormatError, t, "shape ", shape_str(e.shape), " is impossibly large");
    const ojson& off = v["data_offsets"];
    CORELM_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                 FormatError, t, "data_offsets must be [begin, end] of non-negative integers, got ", off.dump());
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    CORELM_CHECK(e.begin <= e.end, FormatError, t, "data_offsets [", e.begin, ", ", e.end, "] are reversed");
    CORELM_CHECK(e.end <= data_bytes, FormatError, t, "data_offsets [", e.begin, ", ", e.end,
                 "] lie outside the data section of ", data_bytes, " bytes (file truncated?)");
    CORELM_CHECK(e.end - e.begin == nbytes, FormatError, t, "data_offsets [",
                 e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes but shape ", shape_str(e.shape), " ", dt,
                 " needs ", nbytes);
    entries.push_back(std::move(e));
  }

  // Overlaps: sort a copy by begin; empty tensors cannot overlap anything.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& a = *by_offset[i - 1];
    const Entry& b = *by_offset[i];
    CORELM_CHECK(b.begin >= a.end, FormatError, w, "tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '",
                 b.name, "' [", b.begin, ", ", b.end, ") overlap");
  }
  return entries;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const std::string w = where(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IOError("cannot open safetensors file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw IOError("cannot stat '" + path + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IOError("'" + path + "' is not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw FormatError(w + "file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  }
  // A private writable mapping: tensors handed out are copy-on-write, so a caller that writes
  // into one changes neither the file nor crashes on a read-only page.
  void* addr = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) throw IOError("cannot mmap '" + path + "': " + std::strerror(map_err));
  std::shared_ptr<void> keep(addr, [file_size](void* p) { ::munmap(p, file_size); });
  auto mapping = Storage::wrap(addr, file_size, keep);
  const char* base = static_cast<const char*>(addr);

  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  CORELM_CHECK(header_len <= kMaxHeaderBytes, FormatError, w, "header length ", header_len,
               " exceeds the limit of ", kMaxHeaderBytes, " bytes (corrupt file?)");
  CORELM_CHECK(header_len <= file_size - 8, FormatError, w, "header length ", header_len,
               " runs past the end of the file (", file_size, " bytes; truncated?)");
  CORELM_CHECK(header_len >= 2, FormatError, w, "header length ", header_len, " is too small for a JSON object");

  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = mapping;
  const uint64_t data_start = 8 + header_len;
  auto entries = parse_header(path, base + 8, header_len, file_size - data_start, f.metadata_);
  for (const auto& e : entries) {
    const uint64_t byte_off = data_start + e.begin;
    const size_t es = dtype_size(e.dtype);
    Tensor t;
    if (byte_off % es == 0) {
      t = Tensor::from_storage(mapping, e.shape, e.dtype, static_cast<int64_t>(byte_off / es));
    } else {
      // A tensor at a byte offset that is not a multiple of its element size (possible from
      // writers that do not sort by alignment; ours and the reference one do) cannot be a
      // typed view without misaligned loads, so it is copied into an aligned buffer.
      auto own = Storage::allocate(e.end - e.begin);
      if (e.end > e.begin) std::memcpy(own->data(), base + byte_off, e.end - e.begin);
      t = Tensor::from_storage(own, e.shape, e.dtype, 0);
    }
    f.names_.push_back(e.name);
    f.tensors_.emplace(e.name, std::move(t));
  }
  return f;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::string known;
    for (size_t i = 0; i < names_.size() && i < 5; ++i) known += (i ? ", " : "") + names_[i];
    if (names_.size() > 5) known += ", ... (" + std::to_string(names_.size()) + " in all)";
    throw IndexError(where(path_) + "no tensor named '" + name + "' (has: " + known + ")");
  }
  return it->second;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  ojson header = ojson::object();
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  // The header lists the tensors in the given order, but their bytes are laid out by
  // decreasing element size (stable), so every tensor starts aligned to its element size and
  // the data section has no gaps (the reference reader rejects gaps).
  std::vector<Tensor> contiguous;
  contiguous.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    CORELM_CHECK(tensor.defined(), ValueError, "save_safetensors '", path, "': tensor '", name, "' is undefined");
    CORELM_CHECK(!name.empty() && name != "__metadata__", ValueError, "save_safetensors '", path,
                 "': invalid tensor name '", name, "'");
    CORELM_CHECK(tensor.device().is_cpu(), DeviceError, "save_safetensors '", path, "': tensor '", name, "' is on ",
                 tensor.device().str());
    contiguous.push_back(tensor.contiguous());
  }
  std::vector<size_t> layout(tensors.size());
  for (size_t i = 0; i < layout.size(); ++i) layout[i] = i;
  std::stable_sort(layout.begin(), layout.end(), [&](size_t a, size_t b) {
    return dtype_size(contiguous[a].dtype()) > dtype_size(contiguous[b].dtype());
  });
  std::vector<uint64_t> begin(tensors.size());
  uint64_t offset = 0;
  for (size_t i : layout) {
    begin[i] = offset;
    offset += contiguous[i].nbytes();
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;
    const Tensor& c = contiguous[i];
    CORELM_CHECK(!header.contains(name), ValueError, "save_safetensors '", path, "': duplicate tensor name '", name,
                 "'");
    header[name] = {{"dtype", st_dtype_name(c.dtype())},
                    {"shape", c.shape()},
                    {"data_offsets", {begin[i], begin[i] + c.nbytes()}}};
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned (as the reference writer does).
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  uint64_t len = text.size();
  char len_bytes[8];
  std::memcpy(len_bytes, &len, 8);

  AtomicWriter out(path);
  out.write(len_bytes, 8);
  out.write(text);
  for (size_t i : layout)
    if (contiguous[i].nbytes() > 0) out.write(contiguous[i].raw_data(), contiguous[i].nbytes());
  out.commit();
}

}  // namespace corelm::io
