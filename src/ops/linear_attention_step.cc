#include "ops/linear_attention_step.h"

#include <cmath>

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
