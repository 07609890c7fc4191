// Picks the GEMM / packed-linear kernel for the active ISA and splits the work into fixed blocks
// (gemm_paths.h) spread over the thread pool. The block grid depends only on the shape, so the
// thread count never changes a result.
#include <cpuid.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "corelm/dtype.h"
#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_paths.h"
#include "kernels/cpu/reference/gemm.h"
#include "kernels/cpu/reference/gemm_bf16.h"
#include "kernels/cpu/tile_emulation.h"

namespace corelm::kernels {
namespace {

// Per-thread, 64-byte aligned scratch that grows to the largest request and is then reused, so
// steady-state calls allocate nothing.
class Scratch {
 public:
  ~Scratch() { std::free(ptr_); }
  void* get(size_t bytes) {
    if (bytes > size_) {
      std::free(ptr_);
      size_ = (bytes + 4095) / 4096 * 4096;
      ptr_ = std::aligned_alloc(64, size_);
      CORELM_CHECK(ptr_ != nullptr, Error, "gemm: cannot allocate ", size_, " bytes of scratch");
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The scratch pointer the last linear_bf16 task of this thread rounded X into.
void*& last_xbuf() {
  thread_local void* p = nullptr;
  return p;
}

GemmF32BlockFn gemm_f32_kernel(Isa isa) {
  switch (isa) {
    case Isa::Reference: return nullptr;
    case Isa::Avx2: return avx2::gemm_f32_block;
    case Isa::Avx512:
    case Isa::Avx512Bf16:
    case Isa::Amx: return avx512::gemm_f32_block;  // no AMX fp32 tiles: AVX-512 is the fp32 path
  }
  return nullptr;
}

LinearBf16BlockFn linear_kernel(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return avx2::linear_bf16_block;
    case Isa::Avx512: return avx512::linear_bf16_block;
    case Isa::Avx512Bf16: return avx512_bf16::linear_bf16_block;
    case Isa::Amx: return amx::linear_bf16_block;
    default: return nullptr;
  }
}

// K as the packed layout of `kernel` stores it: whole tiles of 32 for AMX, whole pairs otherwise.
int64_t padded_k(Isa kernel, int64_t k) {
  if (kernel == Isa::Reference) return k;
  const int64_t unit = kernel == Isa::Amx ? kAmxKBf16 : 2;
  return (k + unit - 1) / unit * unit;
}

// Runs task(t) for t in [0, tasks): inline when there is one task or one thread (no std::function
// or pool round trip on the small-GEMM path), else on the pool.
template <typename Task>
void run_tasks(int64_t tasks, const Task& task) {
  if (tasks == 1 || num_threads() == 1) {
    for (int64_t t = 0; t < tasks; ++t) task(t);
    return;
  }
  parallel_for(tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) task(t);
  });
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// GFLOP/s of `loop`: the median over runs of ~0.5 ms for about `seconds` of CPU time. Timed by
// this thread's CPU clock, so time the core spends on other processes of a shared machine does not
// count; the median, because a single short sample can be mis-accounted (a maximum over many
// picks such outliers).
double best_gflops(double seconds, double flops_per_iter, float (*loop)(int64_t)) {
  const int64_t iters = 200'000;
  volatile float sink = loop(iters * 2);  // warm up: clocks, AVX-512 frequency license
  std::vector<double> rates;
  double spent = 0;
  do {
    const double t0 = thread_cpu_seconds();
    sink = sink + loop(iters);
    const double dt = thread_cpu_seconds() - t0;
    spent += dt;
    if (dt > 0) rates.push_back(flops_per_iter * iters / dt);
  } while (spent < seconds || rates.size() < 5);
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2] * 1e-9;
}

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// The task grid of gemm_paths.h: block(m0, m1, c0, c1) for every block of kGemmRowBlock rows x
// col_block columns (or panels) of a rows x cols output, one task each, column block fastest.
template <typename Block>
void run_blocks(int64_t rows, int64_t cols, int64_t col_block, const Block& block) {
  const int64_t col_blocks = blocks(cols, col_block);
  run_tasks(blocks(rows, kGemmRowBlock) * col_blocks, [&](int64_t t) {
    const int64_t m0 = (t / col_blocks) * kGemmRowBlock, c0 = (t % col_blocks) * col_block;
    block(m0, std::min(m0 + kGemmRowBlock, rows), c0, std::min(c0 + col_block, cols));
  });
}

void run_packed_linear(const float* X, int64_t m, int64_t ldx, const PackedLinear& W, float* Y, int64_t ldy,
                       LinearBf16BlockFn kernel);

void reference_linear(const float* X, int64_t m, int64_t ldx, const PackedLinear& W, float* Y, int64_t ldy) {
  const int64_t n = W.n, k = W.k;
  parallel_for(m, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> xr(static_cast<size_t>(k));
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t t = 0; t < k; ++t) xr[t] = bf16_to_float(float_to_bf16(X[i * ldx + t]));
      for (int64_t j = 0; j < n; ++j) {
        const uint16_t* w = W.data.data() + j * k;
        float acc = 0.0f;
        for (int64_t t = 0; t < k; ++t) acc += xr[t] * bf16_to_float(bf16{w[t]});
        Y[i * ldy + j] = acc + (W.bias.empty() ? 0.0f : W.bias[j]);
      }
    }
  });
}

}  // namespace

double fp32_fma_peak_gflops(double seconds) {
  switch (active_isa()) {
    case Isa::Reference: return 0.0;
    case Isa::Avx2: return best_gflops(seconds, kPeakChains * 8 * 2, avx2::fma_peak_loop);
    default: return best_gflops(seconds, kPeakChains * 16 * 2, avx512::fma_peak_loop);
  }
}

double bf16_dot_peak_gflops(double seconds) {
  if (static_cast<int>(active_isa()) < static_cast<int>(Isa::Avx512Bf16)) return 0.0;
  return best_gflops(seconds, kPeakChains * 16 * 4, avx512_bf16::dpbf16_peak_loop);
}

double amx_bf16_peak_gflops(double seconds) {
  if (active_isa() != Isa::Amx) return 0.0;
  return best_gflops(seconds, amx::kAmxPeakTiles * 16.0 * 16 * 32 * 2, [](int64_t n) { return amx::tile_peak_loop(n, false); });
}

double amx_int8_peak_gops(double seconds) {
  if (active_isa() != Isa::Amx) return 0.0;
  return best_gflops(seconds, amx::kAmxPeakTiles * 16.0 * 16 * 64 * 2, [](int64_t n) { return amx::tile_peak_loop(n, true); });
}

void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  CORELM_CHECK(M >= 0 && N >= 0 && K >= 0, ValueError, "gemm_f32: negative size M=", M, " N=", N, " K=", K);
  const GemmF32BlockFn kernel = gemm_f32_kernel(active_isa());
  if (!kernel) return reference::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (M == 0 || N == 0) return;
  const GemmF32Args g{{trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc}, alpha, beta};
  const size_t pack_bytes = kGemmF32ScratchFloats * sizeof(float);
  run_blocks(M, N, kGemmColBlock, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    kernel(g, m0, m1, n0, n1, static_cast<float*>(scratch().get(pack_bytes)));
  });
}

namespace {

// A rows x cols fp32 matrix (row stride ld) rounded to bf16 values, contiguous.
std::vector<float> rounded_copy(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = bf16_to_float(float_to_bf16(x[i * ld + j]));
  return out;
}

// The rounded-operand path: the same contract through gemm_f32 (a product of two bf16 values is
// exact in fp32), or the scalar reference on the reference path.
void gemm_bf16_rounded(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                       const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (active_isa() == Isa::Reference)
    return reference::gemm_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
  const std::vector<float> a = trans_a ? rounded_copy(A, K, M, lda) : rounded_copy(A, M, K, lda);
  const std::vector<float> b = trans_b ? rounded_copy(B, N, K, ldb) : rounded_copy(B, K, N, ldb);
  gemm_f32(trans_a, trans_b, M, N, K, 1.0f, a.data(), trans_a ? M : K, b.data(), trans_b ? K : N,
           accumulate ? 1.0f : 0.0f, C, ldc);
}

// The packed kernels' task grid (gemm_paths.h) with per-thread scratch of `bytes`.
void gemm_bf16_blocks(GemmBf16BlockFn kernel, size_t bytes, bool trans_a, bool trans_b, int64_t M, int64_t N,
                      int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                      bool accumulate) {
  const GemmBf16Args g{{trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc}, (K + 1) / 2 * 2, accumulate};
  // As in run_packed_linear: a thread rounds a row block of op(A) once per call and reuses it for
  // the later column blocks it runs (tasks go column block fastest).
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
  run_blocks(M, N, kGemmColBlock, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    thread_local Scratch own;  // not scratch(): linear_bf16's reuse check must not see this buffer
    thread_local uint64_t rounded_call = 0;
    thread_local int64_t rounded_m0 = -1;
    thread_local void* rounded_buf = nullptr;
    thread_local GemmBf16BlockFn rounded_by = nullptr;
    void* buf = own.get(bytes);
    const bool ready = rounded_call == call && rounded_m0 == m0 && buf == rounded_buf && rounded_by == kernel;
    kernel(g, m0, m1, n0, n1, buf, ready);
    rounded_call = call;
    rounded_m0 = m0;
    rounded_buf = buf;
    rounded_by = kernel;
  });
}

// Sizes and the degenerate cases shared by every gemm_bf16 entry; true when there is work left.
bool gemm_bf16_prologue(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc, bool accumulate) {
  CORELM_CHECK(M >= 0 && N >= 0 && K >= 0, ValueError, "gemm_bf16: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return false;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return false;
  }
  return true;
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const bool dp = static_cast<int>(active_isa()) >= static_cast<int>(Isa::Avx512Bf16);
  gemm_bf16(dp ? Bf16Gemm::Dpbf16 : Bf16Gemm::Rounded, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void gemm_bf16(Bf16Gemm kernel, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
               int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  CORELM_CHECK(bf16_gemm_supported(kernel), ValueError, "gemm_bf16: kernel ", bf16_gemm_name(kernel),
               " is not available on this CPU under CORELM_ISA=", isa_name(active_isa()));
  if (!gemm_bf16_prologue(M, N, K, C, ldc, accumulate)) return;
  const int64_t kp = (K + 1) / 2 * 2;
  switch (kernel) {
    case Bf16Gemm::Rounded: return gemm_bf16_rounded(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    case Bf16Gemm::Dpbf16:
      return gemm_bf16_blocks(avx512_bf16::gemm_bf16_block, static_cast<size_t>(gemm_bf16_scratch_bytes(kp)),
                              trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    case Bf16Gemm::Amx:
      return gemm_bf16_blocks(amx::gemm_bf16_block, static_cast<size_t>(gemm_bf16_tile_scratch_bytes(kp)), trans_a,
                              trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
  }
}

void gemm_bf16_tile_emulation(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                              int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (!gemm_bf16_prologue(M, N, K, C, ldc, accumulate)) return;
  gemm_bf16_blocks(amx_emulated::gemm_bf16_block, static_cast<size_t>(gemm_bf16_tile_scratch_bytes((K + 1) / 2 * 2)),
                   trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

const char* bf16_gemm_name(Bf16Gemm k) {
  switch (k) {
    case Bf16Gemm::Rounded: return "rounded";
    case Bf16Gemm::Dpbf16: return "dpbf16";
    case Bf16Gemm::Amx: return "amx";
  }
  return "?";
}

Bf16Gemm parse_bf16_gemm(std::string_view name) {
  if (name == "rounded") return Bf16Gemm::Rounded;
  if (name == "dpbf16") return Bf16Gemm::Dpbf16;
  if (name == "amx") return Bf16Gemm::Amx;
  throw ValueError("unknown bf16 GEMM kernel '" + std::string(name) + "' (expected auto, amx, dpbf16 or rounded)");
}

bool bf16_gemm_supported(Bf16Gemm k) {
  switch (k) {
    case Bf16Gemm::Rounded: return true;
    case Bf16Gemm::Dpbf16: return static_cast<int>(active_isa()) >= static_cast<int>(Isa::Avx512Bf16);
    case Bf16Gemm::Amx: return active_isa() == Isa::Amx;
  }
  return false;
}

Bf16Gemm choose_bf16_gemm(const Bf16GemmPeaks& peaks) {
  const double best_vector = std::max(peaks.fp32_gflops, peaks.dpbf16_gflops);
  if (peaks.amx_gflops > 0 && peaks.amx_gflops >= kBf16GemmMinSpeedup * best_vector) return Bf16Gemm::Amx;
  if (peaks.dpbf16_gflops > 0 && peaks.dpbf16_gflops >= kBf16GemmMinSpeedup * peaks.fp32_gflops)
    return Bf16Gemm::Dpbf16;
  return Bf16Gemm::Rounded;
}

namespace {

std::mutex& choice_mutex() {
  static std::mutex m;
  return m;
}

std::optional<Bf16GemmChoice>& choice_slot() {
  static std::optional<Bf16GemmChoice> c;
  return c;
}

}  // namespace

Bf16GemmChoice resolve_bf16_gemm(const char* env) {
  Bf16GemmChoice c;
  if (env && *env && std::string_view(env) != "auto") {
    Bf16Gemm k;
    try {
      k = parse_bf16_gemm(env);
    } catch (const ValueError& e) {
      throw ValueError(std::string("CORELM_BF16_GEMM: ") + e.what());
    }
    CORELM_CHECK(bf16_gemm_supported(k), ValueError, "CORELM_BF16_GEMM=", env, ": this CPU (under CORELM_ISA=",
                 isa_name(active_isa()), ") has no ", k == Bf16Gemm::Amx ? "AMX tiles" : "vdpbf16ps",
                 "; use rounded or auto");
    c.kernel = k;
    c.source = "CORELM_BF16_GEMM";
    return c;
  }
  constexpr double kProbeSeconds = 0.003;
  c.peaks.fp32_gflops = fp32_fma_peak_gflops(kProbeSeconds);
  c.peaks.dpbf16_gflops = bf16_dot_peak_gflops(kProbeSeconds);
  c.peaks.amx_gflops = amx_bf16_peak_gflops(kProbeSeconds);
  c.kernel = choose_bf16_gemm(c.peaks);
  c.source = "measured";
  return c;
}

Bf16GemmChoice bf16_gemm_choice() {
  std::lock_guard<std::mutex> lock(choice_mutex());
  if (!choice_slot()) choice_slot() = resolve_bf16_gemm(std::getenv("CORELM_BF16_GEMM"));
  return *choice_slot();
}

void set_bf16_gemm(Bf16Gemm k) {
  CORELM_CHECK(bf16_gemm_supported(k), ValueError, "bf16 GEMM kernel ", bf16_gemm_name(k), " needs ",
               k == Bf16Gemm::Amx ? "AMX tiles" : "vdpbf16ps", ", which this CPU (under CORELM_ISA=",
               isa_name(active_isa()), ") lacks");
  std::lock_guard<std::mutex> lock(choice_mutex());
  Bf16GemmChoice c;
  c.kernel = k;
  c.source = "set";
  choice_slot() = c;
}

Isa preferred_linear_bf16_kernel() {
  const Isa isa = active_isa();
  if (isa != Isa::Avx512Bf16 && isa != Isa::Amx) return isa;
  const char* env = std::getenv("CORELM_BF16_KERNEL");
  if (env && *env) {
    const std::string want(env);
    if (want == "dpbf16") return Isa::Avx512Bf16;
    if (want == "fma") return Isa::Avx512;
    if (want == "amx" && isa == Isa::Amx) return Isa::Amx;
    throw ValueError("CORELM_BF16_KERNEL='" + want + "': expected dpbf16 or fma" +
                     (isa == Isa::Amx ? " or amx" : " (amx needs an AMX CPU and CORELM_ISA allowing it)"));
  }
  if (isa == Isa::Amx) return Isa::Amx;  // tiles beat both vector kernels wherever they exist
  unsigned max_leaf = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid(0, max_leaf, ebx, ecx, edx);
  const bool intel = ebx == 0x756e6547u && edx == 0x49656e69u && ecx == 0x6c65746eu;  // "GenuineIntel"
  return intel ? Isa::Avx512 : Isa::Avx512Bf16;
}

PackedLinear pack_linear_bf16(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias) {
  return pack_linear_bf16(W, n, k, ldw, bias, active_isa());
}

PackedLinear pack_linear_bf16(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Isa kernel) {
  CORELM_CHECK(static_cast<int>(kernel) <= static_cast<int>(detected_isa()), ValueError, "pack_linear_bf16: kernel ",
               isa_name(kernel), " is not supported by this CPU (best: ", isa_name(detected_isa()), ")");
  return pack_linear_bf16_any_cpu(W, n, k, ldw, bias, kernel);
}

PackedLinear pack_linear_bf16_any_cpu(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Isa kernel) {
  CORELM_CHECK(n >= 1 && k >= 1, ValueError, "pack_linear_bf16: need n >= 1 and k >= 1, got n=", n, " k=", k);
  CORELM_CHECK(ldw >= k, ValueError, "pack_linear_bf16: row stride ldw=", ldw, " is less than k=", k);
  CORELM_CHECK(W != nullptr, ValueError, "pack_linear_bf16: null weight pointer");
  PackedLinear p;
  p.n = n;
  p.k = k;
  p.isa = kernel;
  if (bias) p.bias.assign(bias, bias + n);
  if (p.isa == Isa::Reference) {
    p.k_padded = k;
    p.data.resize(static_cast<size_t>(n * k));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < k; ++i) p.data[static_cast<size_t>(j * k + i)] = float_to_bf16(W[j * ldw + i]).bits;
    return p;
  }
  // Panel layout of gemm_paths.h (the same for every vector path and AMX).
  const int64_t kp = padded_k(kernel, k), panels = blocks(n, kLinearPanel);
  p.k_padded = kp;
  p.data.assign(static_cast<size_t>(panels * kp * kLinearPanel), 0);
  for (int64_t j = 0; j < n; ++j) {
    uint16_t* col = p.data.data() + (j / kLinearPanel) * kp * kLinearPanel + (j % kLinearPanel) * 2;
    for (int64_t i = 0; i < k; ++i) col[(i / 2) * 2 * kLinearPanel + i % 2] = float_to_bf16(W[j * ldw + i]).bits;
  }
  return p;
}

void linear_bf16(const float* X, int64_t m, int64_t ldx, const PackedLinear& W, float* Y, int64_t ldy) {
  CORELM_CHECK(m >= 0, ValueError, "linear_bf16: negative row count m=", m);
  CORELM_CHECK(ldx >= W.k && ldy >= W.n, ValueError, "linear_bf16: strides ldx=", ldx, " ldy=", ldy,
               " are smaller than the weight's in_features=", W.k, " / out_features=", W.n);
  CORELM_CHECK(static_cast<int>(W.isa) <= static_cast<int>(detected_isa()), ValueError,
               "linear_bf16: weight packed for ", isa_name(W.isa), " which this CPU does not support");
  if (m == 0) return;
  if (W.isa == Isa::Reference) {
    CORELM_CHECK(static_cast<int64_t>(W.data.size()) == W.n * W.k, ValueError, "linear_bf16: packed weight has ",
                 W.data.size(), " values, expected ", W.n * W.k, " for n=", W.n, " k=", W.k);
    return reference_linear(X, m, ldx, W, Y, ldy);
  }
  const LinearBf16BlockFn kernel = linear_kernel(W.isa);
  CORELM_CHECK(kernel != nullptr, ValueError, "linear_bf16: no kernel for packing ", isa_name(W.isa));
  run_packed_linear(X, m, ldx, W, Y, ldy, kernel);
}

void linear_bf16_tile_emulation(const float* X, int64_t m, int64_t ldx, const PackedLinear& W, float* Y, int64_t ldy) {
  CORELM_CHECK(W.isa == Isa::Amx, ValueError, "linear_bf16_tile_emulation: weight packed for ", isa_name(W.isa),
               ", not amx");
  CORELM_CHECK(m >= 0 && ldx >= W.k && ldy >= W.n, ValueError, "linear_bf16_tile_emulation: bad m/ldx/ldy");
  if (m == 0) return;
  run_packed_linear(X, m, ldx, W, Y, ldy, amx_emulated::linear_bf16_block);
}

namespace {

void run_packed_linear(const float* X, int64_t m, int64_t ldx, const PackedLinear& W, float* Y, int64_t ldy,
                       LinearBf16BlockFn kernel) {
  const int64_t expected = blocks(W.n, kLinearPanel) * W.k_padded * kLinearPanel;
  CORELM_CHECK(static_cast<int64_t>(W.data.size()) == expected && W.k_padded == padded_k(W.isa, W.k), ValueError,
               "linear_bf16: packed weight has ", W.data.size(), " values, expected ", expected,
               " for n=", W.n, " k=", W.k, " packed for ", isa_name(W.isa));
  LinearBf16Args a;
  a.X = X;
  a.ldx = ldx;
  a.W = W.data.data();
  a.bias = W.bias.empty() ? nullptr : W.bias.data();
  a.n = W.n;
  a.k = W.k;
  a.kp = W.k_padded;
  a.Y = Y;
  a.ldy = ldy;
  constexpr int64_t panels_per_block = kGemmColBlock / kLinearPanel;
  const int64_t panels = blocks(W.n, kLinearPanel);
  const size_t xbytes = static_cast<size_t>(linear_bf16_scratch_bytes(a.kp));
  // A thread converts a row block of X once per call and reuses it for the later column blocks it
  // runs (tasks go column block fastest): the rounding is the same either way.
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
  run_blocks(m, panels, panels_per_block, [&](int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    thread_local uint64_t rounded_call = 0;
    thread_local int64_t rounded_m0 = -1;
    void* xbuf = scratch().get(xbytes);  // may reallocate: then nothing is ready
    const bool ready = rounded_call == call && rounded_m0 == m0 && xbuf == last_xbuf();
    kernel(a, m0, m1, p0, p1, xbuf, ready);
    rounded_call = call;
    rounded_m0 = m0;
    last_xbuf() = xbuf;
  });
}

}  // namespace

}  // namespace corelm::kernels
