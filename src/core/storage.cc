#include "corelm/storage.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "corelm/error.h"

namespace corelm {

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda:" + std::to_string(index);
    case DeviceType::HIP: return "hip:" + std::to_string(index);
  }
  return "?";
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  CORELM_CHECK(device.is_cpu(), DeviceError, "cannot allocate on ", device.str(),
               ": this build has only the CPU backend");
  std::shared_ptr<Storage> s(new Storage());
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->owned_ = true;
  // Round up to the alignment so aligned_alloc's size contract holds; never allocate 0 bytes.
  size_t padded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  if (padded == 0) padded = kAlignment;
  s->data_ = std::aligned_alloc(kAlignment, padded);
  if (!s->data_) throw Error("out of memory allocating " + std::to_string(nbytes) + " bytes");
  std::memset(s->data_, 0, padded);
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
  if (owned_) std::free(data_);
}

}  // namespace corelm
