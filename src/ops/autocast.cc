#include "corelm/autocast.h"

#include "corelm/dtype.h"
#include "corelm/error.h"
#include "kernels/cpu/gemm.h"
#include "ops/bf16_operands.h"

namespace corelm::ops {
namespace {
thread_local ComputeDType current = ComputeDType::F32;
}  // namespace

const char* compute_dtype_name(ComputeDType d) {
  switch (d) {
    case ComputeDType::F32: return "f32";
    case ComputeDType::BF16: return "bf16";
  }
  return "?";
}

ComputeDType parse_compute_dtype(const std::string& name) {
  if (name == "f32") return ComputeDType::F32;
  if (name == "bf16") return ComputeDType::BF16;
  throw ValueError("unknown compute dtype '" + name + "' (expected f32 or bf16)");
}

ComputeDType compute_dtype() { return current; }

ComputeDTypeScope::ComputeDTypeScope(ComputeDType d) : saved_(current) { current = d; }
ComputeDTypeScope::~ComputeDTypeScope() { current = saved_; }

std::string bf16_gemm_kernel() { return kernels::bf16_gemm_name(kernels::bf16_gemm_choice().kernel); }

std::string bf16_gemm_kernel_source() { return kernels::bf16_gemm_choice().source; }

void set_bf16_gemm_kernel(const std::string& name) { kernels::set_bf16_gemm(kernels::parse_bf16_gemm(name)); }

std::string keep_bf16_gemm_kernel(const std::string& recorded) {
  const kernels::Bf16Gemm want = kernels::parse_bf16_gemm(recorded);
  const kernels::Bf16Gemm now = kernels::bf16_gemm_choice().kernel;
  if (!kernels::bf16_gemm_supported(want))
    return "bf16 compute: the checkpoint was trained on the " + recorded + " kernel, which this CPU lacks; " +
           "continuing on " + kernels::bf16_gemm_name(now) + " (results no longer bit-identical to an unbroken run)";
  kernels::set_bf16_gemm(want);
  if (want == now) return "";
  return std::string("bf16 compute: keeping the checkpoint's ") + recorded + " kernel (this process would have used " +
         kernels::bf16_gemm_name(now) + ")";
}

kernels::Bf16Gemm detail::bf16_products_kernel() {
  const kernels::Bf16Gemm k = kernels::bf16_gemm_choice().kernel;
  return kernels::bf16_gemm_supported(k) ? k : kernels::Bf16Gemm::Rounded;
}

Tensor detail::rounded_to_bf16(const Tensor& x) {
  const Tensor c = x.contiguous();
  Tensor r = Tensor::empty(c.shape());
  const float* src = c.data<float>();
  float* dst = r.data<float>();
  for (int64_t i = 0, n = c.numel(); i < n; ++i) dst[i] = bf16_to_float(float_to_bf16(src[i]));
  return r;
}

}  // namespace corelm::ops
