#include "core/allocator.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "corelm/error.h"

namespace corelm::alloc {
namespace {

constexpr size_t kAlign = 64;

size_t env_cache_limit() { return parse_cache_limit_mb(std::getenv("CORELM_ALLOC_CACHE_MB")); }

bool env_poison() {
  const char* v = std::getenv("CORELM_ALLOC_POISON");
  return v && *v && std::string(v) != "0";
}

struct Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_lists;  // size class -> blocks
  size_t cached_bytes = 0;
  size_t limit = env_cache_limit();
  bool poison = env_poison();
  uint64_t reused = 0, fresh = 0, returned = 0;

  // Frees cached blocks, largest classes first, until at most `target` bytes stay cached.
  void shrink_to(size_t target) {
    for (auto it = free_lists.end(); cached_bytes > target && it != free_lists.begin();) {
      --it;
      auto& list = it->second;
      while (cached_bytes > target && !list.empty()) {
        std::free(list.back());
        list.pop_back();
        cached_bytes -= it->first;
        ++returned;
      }
    }
  }
};

// Never destroyed: Storage objects released during static destruction still need it.
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

}  // namespace

size_t parse_cache_limit_mb(const char* value) {
  if (!value || !*value) return size_t{1024} << 20;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mb = std::strtoull(value, &end, 10);
  // A typo must not silently become "no cache" or "unbounded".
  CORELM_CHECK(*value != '-' && end != value && *end == '\0' && errno == 0 && mb <= (size_t{1} << 30),
               ValueError, "CORELM_ALLOC_CACHE_MB='", value,
               "': expected a whole number of MiB (0 disables the allocation cache)");
  return static_cast<size_t>(mb) << 20;
}

size_t size_class(size_t nbytes) {
  if (nbytes <= 1024) return nbytes == 0 ? kAlign : (nbytes + kAlign - 1) / kAlign * kAlign;
  // Quarter steps between powers of two: 2^k * {1, 5/4, 6/4, 7/4}.
  size_t pow2 = 1024;
  while (pow2 * 2 < nbytes) pow2 *= 2;  // pow2 < nbytes <= 2 * pow2
  const size_t step = pow2 / 4;
  return (nbytes + step - 1) / step * step;
}

Block acquire(size_t nbytes) {
  const size_t cls = size_class(nbytes);
  Cache& c = cache();
  Block b{nullptr, cls};
  bool poison = false;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    poison = c.poison;
    auto it = c.free_lists.find(cls);
    if (it != c.free_lists.end() && !it->second.empty()) {
      b.data = it->second.back();
      it->second.pop_back();
      c.cached_bytes -= cls;
      ++c.reused;
    } else {
      ++c.fresh;
    }
  }
  if (!b.data) {
    b.data = std::aligned_alloc(kAlign, cls);
    if (!b.data) throw Error("out of memory allocating " + std::to_string(nbytes) + " bytes");
  }
  if (poison) std::memset(b.data, 0xFF, cls);
  return b;
}

void release(Block block) {
  if (!block.data) return;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached_bytes + block.capacity <= c.limit) {
      c.free_lists[block.capacity].push_back(block.data);
      c.cached_bytes += block.capacity;
      return;
    }
    ++c.returned;
  }
  std::free(block.data);
}

Stats stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return Stats{c.cached_bytes, c.limit, c.reused, c.fresh, c.returned};
}

void set_cache_limit(size_t bytes) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.limit = bytes;
  c.shrink_to(bytes);
}

void set_poison(bool on) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.poison = on;
}

bool poison() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.poison;
}

void trim() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.shrink_to(0);
}

}  // namespace corelm::alloc
