// Where a Storage lives. Only CPU is built today; the enum and the allocator interface leave room
// for CUDA/HIP without changing Tensor.
#pragma once
#include <string>

namespace corelm {

enum class DeviceType : uint8_t { CPU, CUDA, HIP };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

}  // namespace corelm
