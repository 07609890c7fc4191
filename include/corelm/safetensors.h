// safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}} and the raw
// little-endian tensor bytes. The reader validates the whole header (well-formed JSON, known
// dtypes, sizes = shape x dtype, offsets inside the file, no overlaps) before any tensor is
// used, and memory-maps the file so tensors are zero-copy views.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "corelm/tensor.h"

namespace corelm::io {

class SafetensorsFile {
 public:
  // Throws IOError (missing/unreadable) or FormatError naming the file and the tensor/field.
  static SafetensorsFile open(const std::string& path);

  const std::vector<std::string>& names() const { return names_; }  // in file order
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  Tensor get(const std::string& name) const;  // zero-copy view; IndexError for unknown names
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::shared_ptr<Storage> mapping_;
  std::vector<std::string> names_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any dtype; non-contiguous ones are copied) in the given order, atomically
// (temp file + rename), so a crash never leaves a half-written file under `path`.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes `bytes` to `path` atomically: temp file in the same folder, fsync, rename.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace corelm::io
