// Mixed-precision compute for training (the analogue of torch.autocast(dtype=bfloat16)): inside a
// ComputeDTypeScope(BF16) the matrix products of ops::matmul / ops::linear and the fused LM-head
// loss take bf16 copies of their operands (weights and activations rounded to bf16, nearest-even)
// and accumulate in fp32; their outputs, the gradients they produce, norms, softmax, the residual
// stream, master weights and AdamW state stay fp32. The setting is per thread (the thread that
// calls the ops; kernels may still run on the pool) and defaults to F32, so nothing changes unless
// a caller asks for it (`corelm train --compute-dtype bf16`).
#pragma once
#include <string>

namespace corelm::ops {

enum class ComputeDType { F32, BF16 };

const char* compute_dtype_name(ComputeDType d);            // "f32" | "bf16"
ComputeDType parse_compute_dtype(const std::string& name);  // ValueError naming the accepted values

ComputeDType compute_dtype();  // this thread's current setting (F32 unless a scope is open)

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
