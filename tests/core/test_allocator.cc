// The caching allocator behind CPU Storage: blocks are reused, aligned, sized by class, capped,
// safe across threads, and poisoned on request.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process_limits.h"
#include "core/allocator.h"
#include "corelm/error.h"
#include "corelm/out_of_memory.h"
#include "corelm/storage.h"
#include "corelm/tensor.h"

using namespace corelm;

namespace {

// Restores the process-wide settings a test changes.
struct AllocatorSettings {
  alloc::Stats saved = alloc::stats();
  bool poison = alloc::poison();
  ~AllocatorSettings() {
    alloc::set_cache_limit(saved.cache_limit);
    alloc::set_poison(poison);
  }
};

}  // namespace

TEST(Allocator, SizeClassesAreAlignedAndBounded) {
  EXPECT_EQ(alloc::size_class(0), 64u);
  EXPECT_EQ(alloc::size_class(1), 64u);
  EXPECT_EQ(alloc::size_class(64), 64u);
  EXPECT_EQ(alloc::size_class(65), 128u);
  EXPECT_EQ(alloc::size_class(1024), 1024u);
  EXPECT_EQ(alloc::size_class(1025), 1280u);
  EXPECT_EQ(alloc::size_class(2048), 2048u);
  EXPECT_EQ(alloc::size_class(2049), 2560u);
  EXPECT_EQ(alloc::size_class(size_t{3} << 20), size_t{3} << 20);
  for (size_t n = 1; n < (size_t{1} << 24); n = n * 3 / 2 + 7) {
    const size_t c = alloc::size_class(n);
    ASSERT_GE(c, n);
    ASSERT_EQ(c % Storage::kAlignment, 0u) << n;
    if (n > 1024) {
      ASSERT_LE(c, n + n / 4 + 1) << n;  // at most 25% slack
    }
  }
}

TEST(Allocator, FreedBlockIsReusedForTheSameClass) {
  AllocatorSettings keep;
  alloc::set_cache_limit(size_t{64} << 20);
  alloc::trim();
  const alloc::Block a = alloc::acquire(100000);
  void* first = a.data;
  alloc::release(a);
  EXPECT_EQ(alloc::stats().cached_bytes, a.capacity);
  const uint64_t reused_before = alloc::stats().reused;
  const alloc::Block b = alloc::acquire(alloc::size_class(100000) - 10);  // same class
  EXPECT_EQ(b.data, first);
  EXPECT_EQ(alloc::stats().reused, reused_before + 1);
  EXPECT_EQ(alloc::stats().cached_bytes, 0u);
  alloc::release(b);
}

TEST(Allocator, StorageAndTensorsAreAlignedAndSized) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{4097}, size_t{1} << 20}) {
    auto s = Storage::allocate_uninitialized(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % Storage::kAlignment, 0u) << n;
    EXPECT_EQ(s->nbytes(), n);
    if (n > 0) std::memset(s->data(), 0xAB, n);  // the whole range is writable (ASan checks it)
  }
  Tensor t = Tensor::empty({3, 5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data<float>()) % Storage::kAlignment, 0u);
}

TEST(Allocator, ZerosAreZeroEvenOnAReusedDirtyBlock) {
  AllocatorSettings keep;
  alloc::set_cache_limit(size_t{64} << 20);
  alloc::set_poison(false);
  void* dirty_ptr = nullptr;
  {
    Tensor dirty = Tensor::full({1000}, 7.0);
    dirty_ptr = dirty.data<float>();
  }
  Tensor z = Tensor::zeros({1000});
  EXPECT_EQ(static_cast<void*>(z.data<float>()), dirty_ptr);  // the dirty block came back
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(z.data<float>()[i], 0.0f);
  auto s = Storage::allocate(4000);
  const unsigned char* p = static_cast<const unsigned char*>(s->data());
  for (int i = 0; i < 4000; ++i) ASSERT_EQ(p[i], 0);
}

TEST(Allocator, CapIsRespected) {
  AllocatorSettings keep;
  alloc::set_cache_limit(size_t{1} << 20);
  alloc::trim();
  std::vector<alloc::Block> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc::acquire(300000));  // 8 x 320 KiB class
  const uint64_t returned_before = alloc::stats().returned;
  for (const auto& b : blocks) alloc::release(b);
  const alloc::Stats st = alloc::stats();
  EXPECT_LE(st.cached_bytes, size_t{1} << 20);
  EXPECT_EQ(st.cached_bytes, 3 * alloc::size_class(300000));
  EXPECT_EQ(st.returned, returned_before + 5);
  // Lowering the cap frees what no longer fits.
  alloc::set_cache_limit(alloc::size_class(300000));
  EXPECT_EQ(alloc::stats().cached_bytes, alloc::size_class(300000));
  // A zero cap caches nothing.
  alloc::set_cache_limit(0);
  EXPECT_EQ(alloc::stats().cached_bytes, 0u);
  alloc::release(alloc::acquire(5000));
  EXPECT_EQ(alloc::stats().cached_bytes, 0u);
}

TEST(Allocator, ConcurrentAcquireAndReleaseFromThreads) {
  AllocatorSettings keep;
  alloc::set_cache_limit(size_t{8} << 20);
  constexpr int kThreads = 8, kRounds = 2000;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      std::vector<Tensor> live;
      for (int r = 0; r < kRounds; ++r) {
        const int64_t n = 1 + (r * 37 + t * 101) % 5000;
        Tensor x = Tensor::full({n}, static_cast<double>(t));
        live.push_back(x);
        if (live.size() > 6) live.erase(live.begin());
        // Every live tensor still holds its own value: no block was handed out twice.
        for (const Tensor& y : live)
          if (y.data<float>()[y.numel() - 1] != static_cast<float>(t)) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_LE(alloc::stats().cached_bytes, size_t{8} << 20);
}

TEST(Allocator, PoisonModeFillsNewBuffersWithNaN) {
  AllocatorSettings keep;
  alloc::set_poison(true);
  Tensor e = Tensor::empty({257});
  for (int64_t i = 0; i < e.numel(); ++i) ASSERT_TRUE(std::isnan(e.data<float>()[i])) << i;
  {
    Tensor written = Tensor::full({300}, 1.0);  // a dirty block goes back to the cache...
  }
  Tensor again = Tensor::empty({300});  // ...and comes out poisoned again
  for (int64_t i = 0; i < again.numel(); ++i) ASSERT_TRUE(std::isnan(again.data<float>()[i])) << i;
  Tensor z = Tensor::zeros({300});  // zeros() is still zeros
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data<float>()[i], 0.0f);
  alloc::set_poison(false);
  Tensor plain = Tensor::empty({64});
  (void)plain;
}

TEST(Allocator, PoisonFollowsTheEnvironment) {
  // The setting is read from CORELM_ALLOC_POISON at first use (the suite is run with it set to
  // check that nothing reads memory it did not write; see docs/TRAINING.md).
  const char* v = std::getenv("CORELM_ALLOC_POISON");
  const bool want = v && *v && std::string(v) != "0";
  EXPECT_EQ(alloc::poison(), want);
}

TEST(Allocator, CacheLimitVariableIsParsedOrRejectedClearly) {
  EXPECT_EQ(alloc::parse_cache_limit_mb(nullptr), size_t{1024} << 20);
  EXPECT_EQ(alloc::parse_cache_limit_mb(""), size_t{1024} << 20);
  EXPECT_EQ(alloc::parse_cache_limit_mb("0"), 0u);
  EXPECT_EQ(alloc::parse_cache_limit_mb("256"), size_t{256} << 20);
  for (const char* bad : {"abc", "12MB", "-1", "1.5", "99999999999999999999"}) {
    try {
      alloc::parse_cache_limit_mb(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("CORELM_ALLOC_CACHE_MB"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------- out of memory (issue 13, defect 7)

namespace {

using corelm::testing::kAddressSanitizer;

using corelm::testing::vm_size;

// Runs fn in a forked child and returns its exit code (128 + signal when it was killed, e.g.
// 134 for the SIGABRT of std::terminate).
template <typename Fn>
int in_child(Fn fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 99;
    try {
      rc = fn();
    } catch (...) {
      rc = 98;
    }
    ::_exit(rc);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void limit_address_space(size_t bytes) {
  rlimit r{static_cast<rlim_t>(bytes), static_cast<rlim_t>(bytes)};
  ::setrlimit(RLIMIT_AS, &r);
}

}  // namespace

TEST(Allocator, OutOfMemoryIsAnErrorNamingTheBytesAndTheTensor) {
  try {
    alloc::acquire(alloc::kMaxBlockBytes + 1);
    ADD_FAILURE() << "an impossible size was served";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory allocating"), std::string::npos) << e.what();
  }
  // A shape whose byte count wraps is refused, not served with a small buffer.
  EXPECT_THROW(Tensor::empty({int64_t{1} << 40, int64_t{1} << 30}), ShapeError);
  if (kAddressSanitizer) GTEST_SKIP() << "RLIMIT_AS does not work under AddressSanitizer";
  const int rc = in_child([] {
    limit_address_space(vm_size() + (size_t{64} << 20));
    try {
      Tensor t = Tensor::empty({int64_t{256} << 20});  // 1 GiB of f32 under a 64 MiB headroom
      return 1;
    } catch (const OutOfMemoryError& e) {
      return std::string(e.what()) == "out of memory allocating 1073741824 bytes (1024.0 MiB) for f32 tensor [268435456]"
                 ? 0
                 : 2;
    }
  });
  EXPECT_EQ(rc, 0) << "1: the allocation succeeded; 2: wrong message; 98: another exception";
}

// Storage's destructor (noexcept) returns blocks to the cache. When the heap is exhausted, as
// while an out-of-memory error unwinds, caching a block of a size class not seen before used to
// need a std::map node: bad_alloc escaped the destructor and std::terminate aborted the process.
TEST(Allocator, ReleaseNeverThrowsWhenTheHeapIsExhausted) {
  if (kAddressSanitizer) GTEST_SKIP() << "RLIMIT_AS does not work under AddressSanitizer";
  const int rc = in_child([] {
    alloc::set_cache_limit(size_t{512} << 20);
    std::vector<Tensor> held;
    held.reserve(64);
    // Size classes 1.25 * 2^k and 1.75 * 2^k floats for k = 17 .. 22: unusual for other tests.
    for (int k = 17; k <= 22; ++k) {
      held.push_back(Tensor::empty({(int64_t{5} << k) / 4 + 1}));
      held.push_back(Tensor::empty({(int64_t{7} << k) / 4 + 3}));
    }
    std::vector<void*> ballast;  // reserved first: filling it needs no memory
    ballast.reserve(1 << 16);
    limit_address_space(vm_size() + (size_t{8} << 20));
    for (size_t n = size_t{1} << 20; n >= 16; n /= 2)
      while (ballast.size() < ballast.capacity()) {
        void* p = std::malloc(n);
        if (!p) break;
        ballast.push_back(p);
      }
    held.clear();  // every release runs with the heap full
    for (void* p : ballast) std::free(p);
    return 0;
  });
  EXPECT_EQ(rc, 0) << "134 is the SIGABRT of std::terminate";
}
