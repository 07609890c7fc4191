// Batched matmul with transpose flags and broadcast batch dims, and nn.Linear on top of it.
// Each batch item is one call of the GEMM kernel; batch dims of an operand that is broadcast
// get stride 0, so it is never copied. When b has no batch dims the batch of a is folded into
// the rows of a single GEMM.
//
// Under ComputeDTypeScope(BF16) (corelm/autocast.h) both operands of every product -- forward and
// the two backward products, which use the setting captured at forward time -- are rounded to bf16
// (nearest-even) and multiplied with fp32 accumulation; outputs and gradients stay fp32. Where the
// process's bf16 kernel is dpbf16 or amx (corelm/autocast.h) the products run on kernels::gemm_bf16;
// else the rounded operands go through gemm_f32 (products of bf16 values are exact in fp32, so this
// is the same contract). Packing the weight per call for kernels::linear_bf16 measured no faster
// for training on the Intel development core (docs/TRAINING.md, "bf16 compute");
// CORELM_AUTOCAST_LINEAR=packed selects it for the forward X.W^T to re-measure elsewhere.
#include <cstdlib>
#include <cstring>

#include "corelm/autocast.h"
#include "corelm/autograd.h"
#include "corelm/dtype.h"
#include "corelm/ops.h"
#include "kernels/cpu/gemm.h"
#include "ops/bf16_operands.h"
#include "ops/op_checks.h"

namespace corelm::ops {
namespace {
namespace kern = kernels;

Shape batch_of(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 2); }

// Element strides of x's batch dims when read as `batch` (right-aligned, 0 where broadcast).
Strides batch_strides(const Tensor& x, const Shape& batch) {
  const Strides own = contiguous_strides(x.shape());
  const size_t xb = x.shape().size() - 2, offset = batch.size() - xb;
  Strides s(batch.size(), 0);
  for (size_t d = 0; d < xb; ++d) s[offset + d] = x.shape()[d] == 1 ? 0 : own[d];
  return s;
}

bool packed_linear_forward() {
  static const bool packed = [] {
    const char* v = std::getenv("CORELM_AUTOCAST_LINEAR");
    return v && std::strcmp(v, "packed") == 0;
  }();
  return packed;
}

Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta, bool tb, ComputeDType cd) {
  detail::check_f32("matmul", a, "a");
  detail::check_f32("matmul", b, "b");
  CORELM_CHECK(a.dim() >= 2 && b.dim() >= 2, ShapeError,
               "matmul: operands need at least 2 dims, got a ", shape_str(a.shape()), " and b ",
               shape_str(b.shape()));
  const int64_t M = ta ? a.size(-1) : a.size(-2), K = ta ? a.size(-2) : a.size(-1);
  const int64_t Kb = tb ? b.size(-1) : b.size(-2), N = tb ? b.size(-2) : b.size(-1);
  CORELM_CHECK(K == Kb, ShapeError, "matmul: inner dims differ: a ", shape_str(a.shape()),
               (ta ? " (transposed)" : ""), " vs b ", shape_str(b.shape()),
               (tb ? " (transposed)" : ""));
  Shape batch;
  try {
    batch = broadcast_shapes(batch_of(a), batch_of(b));
  } catch (const ShapeError&) {
    throw ShapeError(::corelm::detail::concat("matmul: batch dims do not broadcast: a ", shape_str(a.shape()),
                                    " vs b ", shape_str(b.shape())));
  }
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = Tensor::empty(out_shape);
  const bool bf16 = cd == ComputeDType::BF16;
  if (bf16 && packed_linear_forward() && b.dim() == 2 && !ta && tb) {
    // X.W^T for a linear layer: bf16 kernel on a weight packed for this call.
    const Tensor ac = a.contiguous(), bc = b.contiguous();
    const kernels::PackedLinear w = kern::pack_linear_bf16(bc.data<float>(), N, K, K, nullptr,
                                                           kern::preferred_linear_bf16_kernel());
    kern::linear_bf16(ac.data<float>(), shape_numel(batch) * M, K, w, out.data<float>(), N);
    return out;
  }
  // gemm_bf16 rounds its operands itself; the rounded path multiplies rounded copies in fp32.
  const kern::Bf16Gemm kernel = bf16 ? detail::bf16_products_kernel() : kern::Bf16Gemm::Rounded;
  const bool on_gemm_bf16 = bf16 && kernel != kern::Bf16Gemm::Rounded;
  const bool round_copies = bf16 && !on_gemm_bf16;
  const Tensor ac = round_copies ? detail::rounded_to_bf16(a) : a.contiguous();
  const Tensor bc = round_copies ? detail::rounded_to_bf16(b) : b.contiguous();
  const float* pa = ac.data<float>();
  const float* pb = bc.data<float>();
  float* pc = out.data<float>();
  const int64_t lda = ac.size(-1), ldb = bc.size(-1);
  auto gemm = [&](bool ta_, bool tb_, int64_t m, const float* pa_, const float* pb_, float* pc_) {
    if (on_gemm_bf16)
      kern::gemm_bf16(kernel, ta_, tb_, m, N, K, pa_, lda, pb_, ldb, pc_, N);
    else
      kern::gemm_f32(ta_, tb_, m, N, K, 1.0f, pa_, lda, pb_, ldb, 0.0f, pc_, N);
  };

  if (b.dim() == 2 && !ta) {
    // Rows of every batch item of a are rows of one tall [batch * M, K] matrix.
    gemm(false, tb, shape_numel(batch) * M, pa, pb, pc);
    return out;
  }
  const Strides sa = batch_strides(ac, batch), sb = batch_strides(bc, batch);
  const int64_t items = shape_numel(batch);
  for (int64_t item = 0; item < items; ++item) {
    int64_t rem = item, off_a = 0, off_b = 0;
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      const int64_t i = rem % batch[d];
      rem /= batch[d];
      off_a += i * sa[d];
      off_b += i * sb[d];
    }
    gemm(ta, tb, M, pa + off_a, pb + off_b, pc + item * M * N);
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  const ComputeDType cd = compute_dtype();
  Tensor out = matmul_forward(a, b, transpose_a, transpose_b, cd);
  if (autograd::needs_grad({a, b})) {
    const bool need_a = autograd::needs_grad({a}), need_b = autograd::needs_grad({b});
    autograd::record(
        out, "matmul", {a, b},
        [a = a.detach(), b = b.detach(), ta = transpose_a, tb = transpose_b, need_a, need_b,
         cd](const Tensor& g) {
          // The backward products use the forward's compute dtype, whatever scope backward runs in.
          ComputeDTypeScope scope(cd);
          // With C = op(A) op(B): d op(A) = dC op(B)^T and d op(B) = op(A)^T dC; a transposed
          // operand takes the transpose of that, written as one matmul with swapped flags.
          Tensor ga, gb;
          if (need_a) ga = sum_to(ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb), a.shape());
          if (need_b && b.dim() == 2 && a.dim() > 2 && !ta) {
            // Fold a's batch into rows (as the forward did), so dB is one GEMM rather than a
            // per-item product materialised and then summed.
            const Tensor a2 = reshape(a, {-1, a.size(-1)}), g2 = reshape(g, {-1, g.size(-1)});
            gb = tb ? matmul(g2, a2, true, false) : matmul(a2, g2, true, false);
          } else if (need_b) {
            gb = sum_to(tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false), b.shape());
          }
          return std::vector<Tensor>{ga, gb};
        });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_f32("linear", x, "x");
  detail::check_f32("linear", weight, "weight");
  CORELM_CHECK(weight.dim() == 2, ShapeError, "linear: weight must be [out, in], got ",
               shape_str(weight.shape()));
  CORELM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), ShapeError,
               "linear: x ", shape_str(x.shape()), " does not end in in_features of weight ",
               shape_str(weight.shape()));
  if (bias.defined()) {
    detail::check_f32("linear", bias, "bias");
    CORELM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), ShapeError, "linear: bias ",
                 shape_str(bias.shape()), " does not match weight ", shape_str(weight.shape()));
  }
  // A 1-D x is one row; matmul wants at least 2 dims.
  Tensor x2 = x.dim() == 1 ? reshape(x, {1, x.size(0)}) : x;
  Tensor y = matmul(x2, weight, false, true);
  if (bias.defined()) y = add(y, bias);
  if (x.dim() == 1) y = reshape(y, {weight.size(0)});
  return y;
}

}  // namespace corelm::ops
