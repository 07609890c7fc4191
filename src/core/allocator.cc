#include "core/allocator.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "corelm/error.h"
#include "corelm/out_of_memory.h"

namespace corelm::alloc {
namespace {

constexpr size_t kAlign = 64;

size_t env_cache_limit() { return parse_cache_limit_mb(std::getenv("CORELM_ALLOC_CACHE_MB")); }

bool env_poison() {
  const char* v = std::getenv("CORELM_ALLOC_POISON");
  return v && *v && std::string(v) != "0";
}

// Size classes up to kMaxBlockBytes, indexed densely: 16 small ones (64 .. 1024 bytes), then four
// per octave 2^k < c <= 2^(k+1) for k = 10 .. 61.
constexpr int kSmallClasses = 16;
constexpr int kClasses = kSmallClasses + 4 * (61 - 10 + 1);

int class_index(size_t cls) {
  if (cls <= 1024) return static_cast<int>(cls / kAlign) - 1;
  const int k = 63 - __builtin_clzll(static_cast<unsigned long long>(cls - 1));  // 2^k < cls <= 2^(k+1)
  const size_t pow2 = size_t{1} << k;
  const int quarter = static_cast<int>((cls - pow2) / (pow2 / 4));  // 1 .. 4
  return kSmallClasses + (k - 10) * 4 + (quarter - 1);
}

size_t class_bytes(int index) {
  if (index < kSmallClasses) return static_cast<size_t>(index + 1) * kAlign;
  const int k = 10 + (index - kSmallClasses) / 4;
  const size_t pow2 = size_t{1} << k;
  return pow2 + static_cast<size_t>((index - kSmallClasses) % 4 + 1) * (pow2 / 4);
}

// A cached block's first bytes hold the next cached block of its class.
void*& next_of(void* block) { return *static_cast<void**>(block); }

struct Cache {
  std::mutex mu;
  void* heads[kClasses] = {};  // size class index -> last freed block (LIFO)
  size_t cached_bytes = 0;
  size_t limit = env_cache_limit();
  bool poison = env_poison();
  uint64_t reused = 0, fresh = 0, returned = 0;

  void push(int index, void* block) {
    next_of(block) = heads[index];
    heads[index] = block;
  }
  void* pop(int index) {
    void* block = heads[index];
    if (block) heads[index] = next_of(block);
    return block;
  }

  // Frees cached blocks, largest classes first, until at most `target` bytes stay cached.
  void shrink_to(size_t target) {
    for (int i = kClasses - 1; i >= 0 && cached_bytes > target; --i) {
      const size_t bytes = class_bytes(i);
      while (cached_bytes > target && heads[i]) {
        std::free(pop(i));
        cached_bytes -= bytes;
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
  if (nbytes > kMaxBlockBytes) return nbytes;  // not served (acquire refuses it)
  if (nbytes <= 1024) return nbytes == 0 ? kAlign : (nbytes + kAlign - 1) / kAlign * kAlign;
  // Quarter steps between powers of two: 2^k * {1, 5/4, 6/4, 7/4}.
  size_t pow2 = 1024;
  while (pow2 * 2 < nbytes) pow2 *= 2;  // pow2 < nbytes <= 2 * pow2
  const size_t step = pow2 / 4;
  return (nbytes + step - 1) / step * step;
}

Block acquire(size_t nbytes) {
  if (nbytes > kMaxBlockBytes) throw OutOfMemoryError(nbytes, "");
  const size_t cls = size_class(nbytes);
  const int index = class_index(cls);
  Cache& c = cache();
  Block b{nullptr, cls};
  bool poison = false;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    poison = c.poison;
    b.data = c.pop(index);
    if (b.data) {
      c.cached_bytes -= cls;
      ++c.reused;
    } else {
      ++c.fresh;
    }
  }
  if (!b.data) {
    b.data = std::aligned_alloc(kAlign, cls);
    if (!b.data) {
      // Cached blocks of other classes may be what stands in the way: hand them back, retry once.
      trim();
      b.data = std::aligned_alloc(kAlign, cls);
    }
    if (!b.data) throw OutOfMemoryError(nbytes, "");
  }
  if (poison) std::memset(b.data, 0xFF, cls);
  return b;
}

void release(Block block) noexcept {
  if (!block.data) return;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached_bytes + block.capacity <= c.limit) {
      c.push(class_index(block.capacity), block.data);  // no allocation: the block is the list node
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
