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

  // Allocates nbytes (zero-filled) on the device; throws DeviceError for devices not built.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device = Device::cpu());

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
  Device device_;
  bool owned_ = false;
  std::shared_ptr<void> keep_alive_;
};

}  // namespace corelm
