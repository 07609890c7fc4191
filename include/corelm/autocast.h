// Mixed-precision compute for training (the analogue of torch.autocast(dtype=bfloat16)): inside a
// ComputeDTypeScope(BF16) the matrix products of ops::matmul / ops::linear and the fused LM-head
// loss take bf16 copies of their operands (weights and activations rounded to bf16, nearest-even)
// and accumulate in fp32; their outputs, the gradients they produce, norms, softmax, the residual
// stream, master weights and AdamW state stay fp32. The setting is per thread (the thread that
// calls the ops; kernels may still run on the pool) and defaults to F32, so nothing changes unless
// a caller asks for it (`corelm train --compute-dtype bf16`).
//
// The bf16 products run on one of three kernels, chosen once per process by measured peaks (never by
// vendor name; kernels/cpu/gemm.h): "amx" (kernels::gemm_bf16 on tdpbf16ps tiles, where their peak
// is at least 1.3x the vector ones), "dpbf16" (kernels::gemm_bf16 on vdpbf16ps, where it issues at
// least 1.3x the fp32 FMA rate) or "rounded" (bf16-rounded fp32 copies through the fp32 GEMM).
// All are the same contract; they differ in summation order (and amx/dpbf16 also round the fused
// LM-head loss's softmax gradient to bf16), so results are not bitwise equal between them.
#pragma once
#include <string>

namespace corelm::ops {

enum class ComputeDType { F32, BF16 };

const char* compute_dtype_name(ComputeDType d);            // "f32" | "bf16"
ComputeDType parse_compute_dtype(const std::string& name);  // ValueError naming the accepted values

ComputeDType compute_dtype();  // this thread's current setting (F32 unless a scope is open)

// The kernel of this process's bf16 products: "amx", "dpbf16" or "rounded". First use measures the
// peaks (a few ms) unless CORELM_BF16_GEMM=amx|dpbf16|rounded|auto says otherwise (ValueError for a
// bad one).
std::string bf16_gemm_kernel();
// How it was chosen: "measured", "CORELM_BF16_GEMM" or "set".
std::string bf16_gemm_kernel_source();
// Fixes the kernel (a resumed training run keeps the one it started with). ValueError naming the
// accepted values, or the missing CPU feature for dpbf16.
void set_bf16_gemm_kernel(const std::string& name);
// For a resumed run: fixes the kernel to `recorded` (the checkpoint's) and returns a note when that
// is not what this process would have used, or when this CPU lacks it (then the run continues on
// the kernel it has, no longer bit-identical); empty when nothing changed. ValueError for a name
// that is not a kernel.
std::string keep_bf16_gemm_kernel(const std::string& recorded);

class ComputeDTypeScope {
 public:
  explicit ComputeDTypeScope(ComputeDType d);
  ~ComputeDTypeScope();
  ComputeDTypeScope(const ComputeDTypeScope&) = delete;
  ComputeDTypeScope& operator=(const ComputeDTypeScope&) = delete;

 private:
  ComputeDType saved_;
};

}  // namespace corelm::ops
