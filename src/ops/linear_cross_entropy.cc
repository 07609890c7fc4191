// The fused LM head + cross-entropy (full and sampled softmax). Both run kernels::lm_head_loss over
// row chunks and, when an input requires grad, take the gradients from the same pass: the loss is
// the graph's terminal in training, so backward always follows and recomputing the logits there
// would only add a GEMM. The backward then scales the stored gradients by the incoming one.
// Reference path (CORELM_ISA=reference): gemm_f32 and the row kernels fall back to scalar code
// themselves, so the same function serves every ISA.
#include <algorithm>
#include <memory>
#include <vector>

#include "corelm/autocast.h"
#include "corelm/autograd.h"
#include "corelm/dtype.h"
#include "corelm/ops.h"
#include "kernels/cpu/lm_head_loss.h"
#include "ops/bf16_operands.h"
#include "ops/op_checks.h"

namespace corelm::ops {

namespace {

void check_operands(const char* op, const Tensor& hidden, const Tensor& weight, const Tensor& targets) {
  detail::check_f32(op, hidden, "hidden");
  detail::check_f32(op, weight, "weight");
  detail::check_defined(op, targets, "targets");
  detail::check_cpu(op, targets);
  CORELM_CHECK(hidden.dim() == 2, ShapeError, op, ": hidden must be [N, H], got ", shape_str(hidden.shape()));
  CORELM_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(1), ShapeError, op, ": weight must be [V, ",
               hidden.size(1), "] for hidden ", shape_str(hidden.shape()), ", got ", shape_str(weight.shape()));
  CORELM_CHECK(targets.dtype() == DType::I32 || targets.dtype() == DType::I64, DTypeError, op,
               ": targets must be i32 or i64, got ", dtype_name(targets.dtype()), " ", shape_str(targets.shape()));
  CORELM_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0), ShapeError, op, ": targets must be [",
               hidden.size(0), "] for hidden ", shape_str(hidden.shape()), ", got ", shape_str(targets.shape()));
}

// The target ids, checked against [0, v); `count` = rows that are not ignored.
std::vector<int64_t> checked_targets(const char* op, const Tensor& targets, int64_t v, int64_t ignore_index,
                                     int64_t& count) {
  std::vector<int64_t> ids = targets.to_int_vector();
  count = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == ignore_index) continue;
    CORELM_CHECK(ids[i] >= 0 && ids[i] < v, IndexError, op, ": target ", ids[i], " at row ", i,
                 " is outside [0, ", v, ")");
    ++count;
  }
  return ids;
}

// The products' kernel under the current scope: gemm_bf16 (which rounds its operands itself) when
// bf16 compute runs on the dpbf16 or amx kernel.
bool on_gemm_bf16() {
  return compute_dtype() == ComputeDType::BF16 && detail::bf16_products_kernel() != kernels::Bf16Gemm::Rounded;
}

// Contiguous f32 operand, rounded to bf16 values when the autocast scope asks for bf16 products on
// the rounded-operand path.
Tensor compute_operand(const Tensor& x) {
  const Tensor c = x.detach();
  return compute_dtype() == ComputeDType::BF16 && !on_gemm_bf16() ? detail::rounded_to_bf16(c) : c.contiguous();
}

struct Pass {
  double loss = 0;
  Tensor grad_hidden, grad_weight;  // of the mean loss; undefined without grads
};

// Mean loss over `count` rows of hidden . weight^T - offset, and its gradients when `grads`.
Pass run_pass(const Tensor& hidden, const Tensor& weight, const float* offset, const std::vector<int64_t>& targets,
              int64_t count, int64_t ignore_index, bool grads) {
  kernels::LmHeadLoss a;
  a.hidden = hidden.data<float>();
  a.weight = weight.data<float>();
  a.offset = offset;
  a.targets = targets.data();
  a.n = hidden.size(0);
  a.h = hidden.size(1);
  a.v = weight.size(0);
  a.ignore_index = ignore_index;
  a.bf16_products = on_gemm_bf16();
  a.bf16_kernel = detail::bf16_products_kernel();
  Pass p;
  std::vector<float> row_loss(static_cast<size_t>(a.n));
  float* gh = nullptr;
  float* gw = nullptr;
  if (grads) {
    p.grad_hidden = Tensor::empty(hidden.shape());
    p.grad_weight = Tensor::empty(weight.shape());
    gh = p.grad_hidden.data<float>();
    gw = p.grad_weight.data<float>();
  }
  const float grad_scale = count > 0 ? static_cast<float>(1.0 / double(count)) : 0.0f;
  kernels::lm_head_loss(a, row_loss.data(), grad_scale, gh, gw);
  double total = 0.0;  // fixed row order: thread-count independent
  for (float l : row_loss) total += l;
  p.loss = count > 0 ? total / double(count) : 0.0;
  return p;
}

Tensor scaled(const Tensor& grad, float g) { return g == 1.0f ? grad : scale(grad, g); }

}  // namespace

Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets, int64_t ignore_index) {
  constexpr const char* op = "linear_cross_entropy";
  check_operands(op, hidden, weight, targets);
  int64_t count = 0;
  const std::vector<int64_t> ids = checked_targets(op, targets, weight.size(0), ignore_index, count);
  const bool grads = autograd::needs_grad({hidden, weight});
  Pass p = run_pass(compute_operand(hidden), compute_operand(weight), nullptr, ids, count, ignore_index, grads);
  Tensor out = Tensor::full({}, p.loss);
  if (grads) {
    autograd::record(out, op, {hidden, weight, targets},
                     [gh = p.grad_hidden, gw = p.grad_weight](const Tensor& g) {
                       const float s = static_cast<float>(g.item());
                       return std::vector<Tensor>{scaled(gh, s), scaled(gw, s), Tensor()};
                     });
  }
  return out;
}

Tensor sampled_linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                                    const Tensor& candidates, const Tensor& log_correction, int64_t ignore_index) {
  constexpr const char* op = "sampled_linear_cross_entropy";
  check_operands(op, hidden, weight, targets);
  detail::check_defined(op, candidates, "candidates");
  CORELM_CHECK(candidates.dtype() == DType::I64 && candidates.dim() == 1, DTypeError, op,
               ": candidates must be i64 [C], got ", dtype_name(candidates.dtype()), " ",
               shape_str(candidates.shape()));
  detail::check_f32(op, log_correction, "log_correction");
  CORELM_CHECK(log_correction.dim() == 1 && log_correction.size(0) == candidates.size(0), ShapeError, op,
               ": log_correction must be [", candidates.size(0), "] like candidates, got ",
               shape_str(log_correction.shape()));
  const int64_t v = weight.size(0), h = weight.size(1), c = candidates.size(0);
  const std::vector<int64_t> cand = candidates.to_int_vector();
  for (int64_t j = 0; j < c; ++j) {
    CORELM_CHECK(cand[j] >= 0 && cand[j] < v, IndexError, op, ": candidate ", cand[j], " at ", j,
                 " is outside [0, ", v, ")");
    CORELM_CHECK(j == 0 || cand[j] > cand[j - 1], ValueError, op,
                 ": candidates must be strictly increasing; ", cand[j], " at ", j, " follows ", cand[j - 1]);
  }
  int64_t count = 0;
  std::vector<int64_t> ids = checked_targets(op, targets, v, ignore_index, count);
  for (size_t i = 0; i < ids.size(); ++i) {  // class id -> position among the candidates
    if (ids[i] == ignore_index) continue;
    const auto it = std::lower_bound(cand.begin(), cand.end(), ids[i]);
    CORELM_CHECK(it != cand.end() && *it == ids[i], ValueError, op, ": target ", ids[i], " at row ", i,
                 " is not among the candidates");
    ids[i] = it - cand.begin();
  }
  // The candidate rows of the weight, gathered so the kernel sees a dense [C, H] head.
  const Tensor w = weight.contiguous();
  Tensor gathered = Tensor::empty({c, h});
  for (int64_t j = 0; j < c; ++j)
    std::copy_n(w.data<float>() + cand[j] * h, h, gathered.data<float>() + j * h);
  const Tensor rows = compute_operand(gathered);
  const Tensor corr = log_correction.contiguous();
  const bool grads = autograd::needs_grad({hidden, weight});
  Pass p = run_pass(compute_operand(hidden), rows, corr.data<float>(), ids, count, ignore_index, grads);
  Tensor out = Tensor::full({}, p.loss);
  if (grads) {
    autograd::record(out, op, {hidden, weight, targets, candidates, log_correction},
                     [gh = p.grad_hidden, grows = p.grad_weight, cand, v, h](const Tensor& g) {
                       const float s = static_cast<float>(g.item());
                       Tensor gw = Tensor::zeros({v, h});
                       const float* src = grows.data<float>();
                       float* dst = gw.data<float>();
                       for (size_t j = 0; j < cand.size(); ++j)
                         for (int64_t k = 0; k < h; ++k) dst[cand[j] * h + k] = s * src[j * h + k];
                       return std::vector<Tensor>{scaled(gh, s), gw, Tensor(), Tensor(), Tensor()};
                     });
  }
  return out;
}

}  // namespace corelm::ops
