#include "corelm/storage.h"

#include <cstdio>
#include <cstring>

#include "core/allocator.h"
#include "corelm/error.h"
#include "corelm/out_of_memory.h"

namespace corelm {

namespace {
std::string out_of_memory_message(size_t bytes, const std::string& what) {
  std::string m = "out of memory allocating " + std::to_string(bytes) + " bytes";
  if (bytes >= (size_t{1} << 20)) {
    char mib[48];
    std::snprintf(mib, sizeof mib, " (%.1f MiB)", static_cast<double>(bytes) / (1 << 20));
    m += mib;
  }
  if (!what.empty()) m += " for " + what;
  return m;
}
}  // namespace

OutOfMemoryError::OutOfMemoryError(size_t bytes, const std::string& what)
    : Error(out_of_memory_message(bytes, what)), bytes_(bytes), purpose_(what) {}

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda:" + std::to_string(index);
    case DeviceType::HIP: return "hip:" + std::to_string(index);
  }
  return "?";
}

std::shared_ptr<Storage> Storage::allocate_uninitialized(size_t nbytes, Device device) {
  CORELM_CHECK(device.is_cpu(), DeviceError, "cannot allocate on ", device.str(),
               ": this build has only the CPU backend");
  std::shared_ptr<Storage> s(new Storage());
  const alloc::Block block = alloc::acquire(nbytes);
  s->data_ = block.data;
  s->capacity_ = block.capacity;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->owned_ = true;
  return s;
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  std::shared_ptr<Storage> s = allocate_uninitialized(nbytes, device);
  // Zero the padding up to the alignment too, as vector tails may load it.
  std::memset(s->data_, 0, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, std::shared_ptr<void> keep_alive,
                                       Device device) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->owned_ = false;
  s->keep_alive_ = std::move(keep_alive);
  return s;
}

Storage::~Storage() {
  if (owned_) alloc::release(alloc::Block{data_, capacity_});
}

}  // namespace corelm
