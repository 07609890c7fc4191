// Dispatching GEMM entry points used by the ops and the inference path. Each picks the kernel for
// active_isa(); the scalar reference in reference/gemm.h is the contract every path is tested
// against.
//
// Batch invariance (a corelm guarantee, tested): row i of the output depends only on row i of
// op(A), B and K -- never on M, on where the row sits in A, on the other rows or on the thread
// count. Kernels therefore block over M and N freely but reduce over K in one fixed order.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "corelm/isa.h"

namespace corelm::kernels {

// fp32 GEMM with exactly the contract of reference::gemm (see reference/gemm.h):
//   C[M, N] = alpha * op(A) * op(B) + beta * C.
void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// bf16 GEMM for training products: C[M, N] = op(bf16(A)) * op(bf16(B)) with fp32 accumulation
// (accumulate: C += that product), op() as for gemm_f32; every operand value is rounded to bf16
// nearest-even (NaN stays NaN) as ops::detail::rounded_to_bf16 does, A, B and C are fp32. The
// contract is reference/gemm_bf16.h; the result equals it within fp32 accumulation error. Batch
// invariant as above (one fixed K order, an odd K is padded with a zero pair), thread pool as
// gemm_f32. Kernel by active_isa(): vdpbf16ps on K-pair-interleaved panels (Avx512Bf16, Amx), the
// rounded operands through gemm_f32 on Avx2/Avx512, the scalar reference on Reference.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false);
enum class Bf16Gemm;
// The same contract on an explicit kernel (Bf16Gemm below): Rounded = rounded copies through
// gemm_f32 (the reference on Isa::Reference), Dpbf16 = vdpbf16ps, Amx = tdpbf16ps tiles.
// ValueError if !bf16_gemm_supported(kernel).
void gemm_bf16(Bf16Gemm kernel, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
               int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false);

// The kernel bf16-compute training uses for its products, chosen once per process:
//   Rounded  operands rounded to bf16 into fp32 copies, multiplied by gemm_f32 (any CPU)
//   Dpbf16   gemm_bf16 on vdpbf16ps (needs active_isa() >= Avx512Bf16)
//   Amx      gemm_bf16 on tdpbf16ps tiles (needs active_isa() == Amx)
enum class Bf16Gemm { Rounded, Dpbf16, Amx };
const char* bf16_gemm_name(Bf16Gemm k);        // "rounded" | "dpbf16" | "amx"
Bf16Gemm parse_bf16_gemm(std::string_view name);  // ValueError naming the accepted values
bool bf16_gemm_supported(Bf16Gemm k);          // on this CPU under active_isa()

// The selection rule, by measured peaks and never by vendor name: AMX tiles when their tdpbf16ps
// peak is at least kBf16GemmMinSpeedup times the better of the other two; else vdpbf16ps when its
// peak is at least kBf16GemmMinSpeedup times the fp32 FMA peak (AMD Zen4/Zen5 issue it at the full
// rate: 485 vs 263 GFLOP/s measured on a Zen5 core); else the rounded fp32 path (on Intel cores
// before AMX vdpbf16ps issues at half the FMA rate, so a bf16 GEMM would be slower than fp32).
inline constexpr double kBf16GemmMinSpeedup = 1.3;
struct Bf16GemmPeaks {
  double fp32_gflops = 0, dpbf16_gflops = 0, amx_gflops = 0;  // 0: not available
};
Bf16Gemm choose_bf16_gemm(const Bf16GemmPeaks& peaks);

struct Bf16GemmChoice {
  Bf16Gemm kernel = Bf16Gemm::Rounded;
  Bf16GemmPeaks peaks;     // measured (zeros when the choice was not measured)
  std::string source;      // "measured", "CORELM_BF16_GEMM" or "set" (set_bf16_gemm)
};
// The process's choice: CORELM_BF16_GEMM=auto|amx|dpbf16|rounded (auto or unset: measure ~3 ms of
// each peak on the calling core, then choose_bf16_gemm) on first use, or what set_bf16_gemm
// stored. ValueError for an unknown value or a kernel this CPU lacks.
Bf16GemmChoice bf16_gemm_choice();
// What bf16_gemm_choice() decides for the knob's value `env` (null or "" as unset), uncached.
Bf16GemmChoice resolve_bf16_gemm(const char* env);
// Fixes the choice (a resumed training run uses the kernel it started with, whatever a new
// measurement would say). ValueError if !bf16_gemm_supported(k).
void set_bf16_gemm(Bf16Gemm k);

// A linear layer's weight W [N, K] (nn.Linear layout: out_features x in_features), packed once at
// load into bf16 in the layout the kernel for `isa` wants. The layout is private to the kernels.
struct PackedLinear {
  int64_t n = 0, k = 0;     // out_features, in_features
  Isa isa = Isa::Reference; // the path it was packed for; linear_bf16 repacks nothing
  int64_t k_padded = 0;     // K rounded up as the layout needs (zeros in the padding)
  std::vector<uint16_t> data;  // bf16 bit patterns
  std::vector<float> bias;     // empty: no bias
  size_t bytes() const { return data.size() * sizeof(uint16_t) + bias.size() * sizeof(float); }
};

// Rounds W (row-major [n, k], row stride ldw) to bf16 (round-to-nearest-even) and packs it for
// active_isa(). `bias` (n floats) may be null.
PackedLinear pack_linear_bf16(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias);
// The same, packed for the kernel of path `kernel` (Reference, Avx2, Avx512 = bf16 widened to fp32
// FMA, Avx512Bf16 = vdpbf16ps), e.g. to pick the faster kernel for a CPU: on the Intel development
// core vdpbf16ps has half the FMA throughput, so Avx512 is ~30% faster for batches but slower for
// one row (docs/KERNELS.md). ValueError if this CPU lacks the path or it has no linear kernel (Amx).
PackedLinear pack_linear_bf16(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Isa kernel);

// The linear kernel an inference model should pack its weights for on this CPU under active_isa():
// the widening FMA kernel (Avx512) where vdpbf16ps issues at half the FMA rate (Intel cores up to
// Sapphire Rapids: measured 86 vs 179 GFLOP/s here, and 18-31% faster model throughput), the
// vdpbf16ps kernel elsewhere (AMD Zen4 issues it at twice the FMA rate). The choice depends only
// on the CPU vendor (never on a timing), so it is the same on every run; CORELM_BF16_KERNEL=
// dpbf16|fma overrides it. Every row still uses one kernel whatever the batch (batch invariance).
Isa preferred_linear_bf16_kernel();

// Y[m, n] = bf16(X[m, :]) . W[n, :] (+ bias[n]), products of bf16 values accumulated in fp32.
// X is fp32 (row stride ldx) and rounded to bf16 (nearest-even) on the fly; Y is fp32 (row stride
// ldy). Batch invariant as above; uses the thread pool. The kernel is the one W was packed for
// (so a weight packed under CORELM_ISA=reference runs the reference kernel).
void linear_bf16(const float* X, int64_t m, int64_t ldx, const PackedLinear& W, float* Y, int64_t ldy);

// Measured single-thread peaks (GFLOP/s) of the calling core for benchmarks: fp32 vector FMA on
// the widest fp32 path of active_isa() (0 on the reference path), and vdpbf16ps (0 unless
// active_isa() >= Avx512Bf16). A multiply-add counts as 2 flops.
double fp32_fma_peak_gflops(double seconds);
double bf16_dot_peak_gflops(double seconds);
// AMX tile peaks (tdpbf16ps GFLOP/s, tdpbusd GOP/s); 0 unless active_isa() is Amx.
double amx_bf16_peak_gflops(double seconds);
double amx_int8_peak_gops(double seconds);

}  // namespace corelm::kernels
