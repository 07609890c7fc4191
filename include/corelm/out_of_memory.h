// Out of memory as a corelm error: "out of memory allocating N bytes (X MiB) for <what>". The
// allocator behind Storage throws it with an empty `what`; callers that know more rethrow it
// naming the purpose (Tensor::empty/zeros name the tensor's dtype and shape, the KV cache its
// rows, positions and layers, generate how much a batch needs), so a user learns which size to
// lower. A std::bad_alloc from elsewhere (a std::vector) reaches the CLI, which reports it too.
#pragma once
#include <cstddef>
#include <string>

#include "corelm/error.h"

namespace corelm {

class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(size_t bytes, const std::string& what);
  size_t bytes() const { return bytes_; }
  const std::string& purpose() const { return purpose_; }  // the `what` given

 private:
  size_t bytes_;
  std::string purpose_;
};

}  // namespace corelm
