// Log-decay linear attention (see ops.h for the contract, docs/KERNELS.md for the formula and its
// sources). Dispatch: the reference path (CORELM_ISA=reference) runs the per-token recurrence,
// whose backward recomputes every state; every other path runs the chunked parallel form
// (kernels/cpu/linear_attention_fast.h), whose forward keeps the state before each chunk for the
// backward when a gradient is needed. Document ids become one reset flag per position here, so
// the kernels only see "zero the state before t".
#include <cmath>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "kernels/cpu/linear_attention_fast.h"
#include "kernels/cpu/reference/linear_attention.h"
#include "ops/linear_attention_step.h"
#include "ops/op_checks.h"

namespace corelm::ops {
namespace {

using kernels::reference::LinearAttentionDims;
constexpr const char* kOp = "linear_attention";

// reset[b, t] = 1 when doc_ids[b, t] != doc_ids[b, t - 1]; ValueError when a row decreases.
std::vector<uint8_t> reset_flags(const Tensor& doc_ids, int64_t B, int64_t T) {
  CORELM_CHECK(doc_ids.dtype() == DType::I32 || doc_ids.dtype() == DType::I64, DTypeError, kOp,
               ": doc_ids must be i32 or i64, got ", dtype_name(doc_ids.dtype()), " ", shape_str(doc_ids.shape()));
  detail::check_cpu(kOp, doc_ids);
  CORELM_CHECK(doc_ids.dim() == 2 && doc_ids.size(0) == B && doc_ids.size(1) == T, ShapeError, kOp,
               ": doc_ids must be [B, T] = [", B, ", ", T, "], got ", shape_str(doc_ids.shape()));
  const Tensor ids = doc_ids.contiguous();
  auto at = [&](int64_t i) -> int64_t {
    return ids.dtype() == DType::I32 ? ids.data<int32_t>()[i] : ids.data<int64_t>()[i];
  };
  std::vector<uint8_t> reset(static_cast<size_t>(B * T), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T; ++t) {
      const int64_t prev = at(b * T + t - 1), cur = at(b * T + t);
      CORELM_CHECK(cur >= prev, ValueError, kOp, ": doc_ids must be non-decreasing along each row; row ", b,
                   " has ", prev, " at position ", t - 1, " then ", cur);
      reset[b * T + t] = cur != prev;
    }
  return reset;
}

}  // namespace

namespace detail {

void check_log_decay(const char* op, const Tensor& log_decay) {
  const Tensor a = log_decay.contiguous();
  const float* p = a.data<float>();
  const int64_t ds = a.dim() == 2 ? a.size(1) : a.numel();
  for (int64_t i = 0; i < a.numel(); ++i) {
    CORELM_CHECK(std::isfinite(p[i]) && p[i] <= 0.0f, ValueError, op,
                 ": log_decay must be finite and <= 0 (a decay factor exp(a) in (0, 1]); log_decay[", i / ds, ", ",
                 i % ds, "] = ", p[i]);
  }
}

}  // namespace detail

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& log_decay,
                        const Tensor& doc_ids, const Tensor& initial_state, Tensor* final_state,
                        std::optional<float> scale) {
  detail::check_f32(kOp, q, "q");
  detail::check_f32(kOp, k, "k");
  detail::check_f32(kOp, v, "v");
  detail::check_f32(kOp, log_decay, "log_decay");
  const auto shapes = [&] {
    return ::corelm::detail::concat("q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
                                    shape_str(v.shape()), ", log_decay ", shape_str(log_decay.shape()));
  };
  CORELM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, ShapeError, kOp,
               ": q, k, v must be 4-D [B, H, T, D]; got ", shapes());
  CORELM_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0), ShapeError, kOp, ": batch sizes differ; got ",
               shapes());
  CORELM_CHECK(q.size(2) == k.size(2) && k.size(2) == v.size(2), ShapeError, kOp, ": sequence lengths differ; got ",
               shapes());
  CORELM_CHECK(k.size(1) == v.size(1), ShapeError, kOp, ": k and v must have the same kv heads; got ", shapes());
  CORELM_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, ShapeError, kOp,
               ": query heads must be a multiple of kv heads; got ", shapes());
  CORELM_CHECK(q.size(3) == k.size(3) && q.size(3) > 0, ShapeError, kOp,
               ": q and k must share a non-zero state width d_s; got ", shapes());
  CORELM_CHECK(v.size(3) > 0, ShapeError, kOp, ": v must have a non-zero value width d_v; got ", shapes());
  CORELM_CHECK(log_decay.dim() == 2 && log_decay.size(0) == k.size(1) && log_decay.size(1) == k.size(3), ShapeError,
               kOp, ": log_decay must be [Hkv, d_s]; got ", shapes());
  detail::check_log_decay(kOp, log_decay);

  LinearAttentionDims dims;
  dims.batch = q.size(0);
  dims.q_heads = q.size(1);
  dims.kv_heads = k.size(1);
  dims.seq_len = q.size(2);
  dims.state_dim = q.size(3);
  dims.value_dim = v.size(3);
  const Shape state_shape{dims.batch, dims.kv_heads, dims.state_dim, dims.value_dim};
  Tensor init;
  if (initial_state.defined()) {
    detail::check_f32(kOp, initial_state, "initial_state");
    CORELM_CHECK(initial_state.shape() == state_shape, ShapeError, kOp, ": initial_state must be [B, Hkv, d_s, d_v] = ",
                 shape_str(state_shape), ", got ", shape_str(initial_state.shape()));
    init = initial_state.contiguous().detach();
  }
  std::vector<uint8_t> reset;
  if (doc_ids.defined()) reset = reset_flags(doc_ids, dims.batch, dims.seq_len);
  const uint8_t* reset_ptr = reset.empty() ? nullptr : reset.data();
  const float s = scale.value_or(1.0f);

  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), ac = log_decay.contiguous();
  Tensor out = Tensor::empty({dims.batch, dims.q_heads, dims.seq_len, dims.value_dim});
  Tensor last = final_state != nullptr ? Tensor::empty(state_shape) : Tensor();
  const float* init_ptr = init.defined() ? init.data<float>() : nullptr;
  float* last_ptr = last.defined() ? last.data<float>() : nullptr;
  const bool want_grad = autograd::needs_grad({q, k, v, log_decay});
  const bool fast = active_isa() != Isa::Reference;

  Tensor chunk_states;
  if (fast) {
    const int64_t chunk = kernels::fast::kLinearAttentionChunk;
    if (want_grad) {
      chunk_states = Tensor::empty({dims.batch, dims.kv_heads, kernels::fast::linear_attention_chunks(dims.seq_len, chunk),
                                    dims.state_dim, dims.value_dim});
    }
    kernels::fast::linear_attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(), ac.data<float>(),
                                            reset_ptr, init_ptr, out.data<float>(), last_ptr,
                                            want_grad ? chunk_states.data<float>() : nullptr, dims, s, chunk);
  } else {
    kernels::reference::linear_attention_forward(qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                                 ac.data<float>(), reset_ptr, init_ptr, out.data<float>(), last_ptr,
                                                 dims, s);
  }
  if (final_state != nullptr) *final_state = last;
  if (!want_grad) return out;

  autograd::record(
      out, kOp, {q, k, v, log_decay},
      [sq = qc.detach(), sk = kc.detach(), sv = vc.detach(), sa = ac.detach(), init, chunk_states,
       reset = std::move(reset), dims, s, fast](const Tensor& g) {
        const Tensor gc = g.contiguous();
        Tensor gq = Tensor::empty(sq.shape()), gk = Tensor::empty(sk.shape()), gv = Tensor::empty(sv.shape());
        Tensor ga = Tensor::empty(sa.shape());
        const uint8_t* reset_ptr = reset.empty() ? nullptr : reset.data();
        if (fast) {
          kernels::fast::linear_attention_backward(sq.data<float>(), sk.data<float>(), sv.data<float>(),
                                                   sa.data<float>(), reset_ptr, chunk_states.data<float>(),
                                                   gc.data<float>(), gq.data<float>(), gk.data<float>(),
                                                   gv.data<float>(), ga.data<float>(), dims, s,
                                                   kernels::fast::kLinearAttentionChunk);
        } else {
          kernels::reference::linear_attention_backward(
              sq.data<float>(), sk.data<float>(), sv.data<float>(), sa.data<float>(), reset_ptr,
              init.defined() ? init.data<float>() : nullptr, gc.data<float>(), gq.data<float>(), gk.data<float>(),
              gv.data<float>(), ga.data<float>(), dims, s);
        }
        return std::vector<Tensor>{gq, gk, gv, ga};
      });
  return out;
}

}  // namespace corelm::ops
