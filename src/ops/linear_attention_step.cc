#include "ops/linear_attention_step.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/linear_attention_fast.h"
#include "ops/op_checks.h"

namespace corelm::ops {

Tensor linear_attention_decay(const Tensor& log_decay) {
  detail::check_f32("linear_attention_decay", log_decay, "log_decay");
  detail::check_log_decay("linear_attention_decay", log_decay);
  const Tensor a = log_decay.contiguous();
  Tensor decay = Tensor::empty(a.shape());
  // std::exp(1.0f * a) as the chunked kernel's factor table computes W[1]: the same bits.
  for (int64_t i = 0; i < a.numel(); ++i) decay.data<float>()[i] = std::exp(1.0f * a.data<float>()[i]);
  return decay;
}

void linear_attention_step(float* state, const float* q, const float* k, const float* v, const float* decay,
                           float* out, const LinearAttentionStepShape& shape, float scale) {
  kernels::fast::linear_attention_step(state, q, k, v, decay, out, shape.q_heads, shape.kv_heads, shape.state_dim,
                                       shape.value_dim, scale);
}

void linear_attention_prefill(float* state, bool state_zero, const LinearAttentionRun& run, const float* log_decay,
                              const LinearAttentionStepShape& shape, float scale) {
  static_assert(kLinearAttentionPrefillChunk == kernels::fast::kLinearAttentionChunk,
                "the prefill runs the training kernel's chunks");
  const int64_t Hq = shape.q_heads, Hkv = shape.kv_heads, ds = shape.state_dim, dv = shape.value_dim;
  const int64_t group = Hq / Hkv, seg = std::min(run.tokens, kLinearAttentionPrefillSegment);
  // The kernel reads head-major [head, T, width] rows; the inference forward has token-major rows
  // with the heads side by side. Repack one segment at a time into this thread's buffers.
  thread_local kernels::fast::LinearAttentionWorkspace ws;
  thread_local std::vector<float> qh, kh, vh, oh;
  qh.resize(static_cast<size_t>(Hq * seg * ds));
  kh.resize(static_cast<size_t>(Hkv * seg * ds));
  vh.resize(static_cast<size_t>(Hkv * seg * dv));
  oh.resize(static_cast<size_t>(Hq * seg * dv));
  for (int64_t t0 = 0; t0 < run.tokens; t0 += seg) {
    const int64_t n = std::min(seg, run.tokens - t0);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t at = (t0 + t) * run.ld;
      for (int64_t h = 0; h < Hq; ++h) std::copy_n(run.q + at + h * ds, ds, qh.data() + (h * n + t) * ds);
      for (int64_t g = 0; g < Hkv; ++g) {
        std::copy_n(run.k + at + g * ds, ds, kh.data() + (g * n + t) * ds);
        std::copy_n(run.v + at + g * dv, dv, vh.data() + (g * n + t) * dv);
      }
    }
    for (int64_t g = 0; g < Hkv; ++g) {
      kernels::fast::linear_attention_forward_group(qh.data() + g * group * n * ds, n * ds, kh.data() + g * n * ds,
                                                    vh.data() + g * n * dv, log_decay + g * ds, state + g * ds * dv,
                                                    state_zero && t0 == 0, oh.data() + g * group * n * dv, n * dv, n,
                                                    group, ds, dv, scale, ws);
    }
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        std::copy_n(oh.data() + (h * n + t) * dv, dv, run.out + (t0 + t) * run.ldo + h * dv);
  }
}

Tensor linear_attention_step(Tensor& state, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                             std::optional<float> scale) {
  constexpr const char* op = "linear_attention_step";
  detail::check_f32(op, state, "state");
  detail::check_f32(op, q, "q");
  detail::check_f32(op, k, "k");
  detail::check_f32(op, v, "v");
  detail::check_f32(op, decay, "decay");
  const auto shapes = [&] {
    return ::corelm::detail::concat("state ", shape_str(state.shape()), ", q ", shape_str(q.shape()), ", k ",
                                    shape_str(k.shape()), ", v ", shape_str(v.shape()), ", decay ",
                                    shape_str(decay.shape()));
  };
  CORELM_CHECK(state.dim() == 3 && q.dim() == 2 && k.dim() == 2 && v.dim() == 2 && decay.dim() == 2, ShapeError, op,
               ": expected state [Hkv, d_s, d_v], q [Hq, d_s], k [Hkv, d_s], v [Hkv, d_v], decay [Hkv, d_s]; got ",
               shapes());
  const LinearAttentionStepShape sh{q.size(0), state.size(0), state.size(1), state.size(2)};
  CORELM_CHECK(sh.kv_heads > 0 && sh.q_heads % sh.kv_heads == 0 && q.size(1) == sh.state_dim &&
                   k.size(0) == sh.kv_heads && k.size(1) == sh.state_dim && v.size(0) == sh.kv_heads &&
                   v.size(1) == sh.value_dim && decay.size(0) == sh.kv_heads && decay.size(1) == sh.state_dim,
               ShapeError, op, ": shapes do not agree; got ", shapes());
  CORELM_CHECK(state.is_contiguous(), ValueError, op, ": state must be contiguous (it is updated in place)");
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), dc = decay.contiguous();
  Tensor out = Tensor::empty({sh.q_heads, sh.value_dim});
  linear_attention_step(state.data<float>(), qc.data<float>(), kc.data<float>(), vc.data<float>(), dc.data<float>(),
                        out.data<float>(), sh, scale.value_or(1.0f));
  return out;
}

}  // namespace corelm::ops
