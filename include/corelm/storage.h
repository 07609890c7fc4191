// Storage: an owning, 64-byte aligned byte buffer on one device. Tensors are views over it, so
// several tensors may share one Storage (views, slices, transposes).
#pragma once
#include <cstddef>
#include <memory>

#include "corelm/device.h"

namespace corelm {

class Storage {
 public:
  static constexpr size_t kAlignment = 64;

  // Allocates nbytes (zero-filled) on the device; throws DeviceError for devices not built and
  // OutOfMemoryError (corelm/out_of_memory.h) when the memory cannot be had.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device = Device::cpu());
  // The same without the zero fill (Tensor::empty): contents are unspecified, the caller writes
  // every byte it reads. CPU memory comes from a caching allocator (src/core/allocator.h); with
  // CORELM_ALLOC_POISON=1 it is filled with 0xFF bytes (NaN as floats) to expose reads of
  // unwritten memory.
  static std::shared_ptr<Storage> allocate_uninitialized(size_t nbytes, Device device = Device::cpu());

  // Wraps memory owned elsewhere (e.g. an mmap'd file); `keep_alive` is held until destruction.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, std::shared_ptr<void> keep_alive,
                                       Device device = Device::cpu());

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  size_t capacity_ = 0;  // the allocator's size class of an owned buffer
  Device device_;
  bool owned_ = false;
  std::shared_ptr<void> keep_alive_;
};

}  // namespace corelm
