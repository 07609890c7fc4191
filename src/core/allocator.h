// Caching allocator behind CPU Storage. Training allocates the same few hundred buffer sizes every
// step; fresh large buffers from the C heap cost a page fault per 4 KiB page (and used to be
// memset as well), ~14% of a tiny training step. Freed blocks are therefore kept on per-size-class
// free lists and handed out again.
//
// Size classes: up to 1 KiB, multiples of 64 bytes; above, 2^k, 1.25*2^k, 1.5*2^k and 1.75*2^k
// (so at most 25% of a block is slack). Every block is 64-byte aligned (Storage::kAlignment).
// The bytes held in free lists are capped (env CORELM_ALLOC_CACHE_MB, default 1024; 0 disables
// caching): a freed block that would exceed the cap goes back to the C heap (free(), which
// unmaps large blocks). One mutex guards the lists; allocation is per tensor, not per element.
//
// release() never throws and never allocates: it runs in Storage's destructor, often while an
// exception (an out-of-memory one, say) unwinds, where a throw would end in std::terminate. So
// the free lists are intrusive (a cached block holds the pointer to the next one in its first
// bytes) and there is one list head per size class in a fixed array: caching a block costs no
// bookkeeping memory. An acquire that the C heap refuses first returns every cached block to it
// and tries again, then throws OutOfMemoryError.
//
// Contents of a returned block are unspecified (whatever the last user wrote) unless poisoning is
// on (env CORELM_ALLOC_POISON=1): then every block is filled with 0xFF bytes, a NaN in f32, bf16,
// f16 and f64 and -1 in integers, so a read of memory nobody wrote shows up in results.
#pragma once
#include <cstddef>
#include <cstdint>

namespace corelm::alloc {

struct Block {
  void* data = nullptr;
  size_t capacity = 0;  // the size class; pass it back to release()
};

// The largest request served; a larger one is an OutOfMemoryError at once (no machine has it,
// and the size-class arithmetic stays clear of overflow).
constexpr size_t kMaxBlockBytes = size_t{1} << 62;

// A 64-byte aligned block of at least nbytes (at least 64 bytes for nbytes == 0). Throws
// corelm::OutOfMemoryError ("out of memory allocating N bytes") when the memory cannot be had.
Block acquire(size_t nbytes);
void release(Block block) noexcept;

// The cap in bytes for a CORELM_ALLOC_CACHE_MB value (null or empty: the default, 1024 MiB);
// ValueError naming the variable for anything but a whole number.
size_t parse_cache_limit_mb(const char* value);

// The size class a request of nbytes is served from (nbytes <= kMaxBlockBytes).
size_t size_class(size_t nbytes);

struct Stats {
  size_t cached_bytes = 0;   // bytes sitting in free lists now
  size_t cache_limit = 0;    // the cap in bytes
  uint64_t reused = 0;       // acquires served from a free list
  uint64_t fresh = 0;        // acquires that went to the C heap
  uint64_t returned = 0;     // releases that went back to the C heap (cap or caching off)
};
Stats stats();

// Test and tuning hooks; the environment sets both at first use.
void set_cache_limit(size_t bytes);  // frees cached blocks beyond the new cap
void set_poison(bool on);
bool poison();
void trim();  // returns every cached block to the C heap

}  // namespace corelm::alloc
