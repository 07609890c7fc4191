// Shape checks shared by the attention ops (causal_attention, sliding_window_attention): q
// [B, Hq, T, D], k and v [B, Hkv, S, D], f32, Hkv dividing Hq, S >= T; errors name the op and all
// three shapes. Private to ops.
#pragma once
#include "kernels/cpu/reference/attention.h"
#include "ops/op_checks.h"

namespace corelm::ops::detail {

inline kernels::reference::AttentionDims checked_attention_dims(const char* op, const Tensor& q, const Tensor& k,
                                                                const Tensor& v) {
  check_f32(op, q, "q");
  check_f32(op, k, "k");
  check_f32(op, v, "v");
  const auto shapes = [&] {
    return ::corelm::detail::concat("q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
                                    shape_str(v.shape()));
  };
  CORELM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, ShapeError, op,
               ": q, k, v must be 4-D [B, H, T, D]; got ", shapes());
  CORELM_CHECK(k.shape() == v.shape(), ShapeError, op, ": k and v must have the same shape; got ", shapes());
  CORELM_CHECK(q.size(0) == k.size(0), ShapeError, op, ": batch sizes differ; got ", shapes());
  CORELM_CHECK(q.size(3) == k.size(3), ShapeError, op, ": head dims differ; got ", shapes());
  CORELM_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, ShapeError, op,
               ": query heads must be a multiple of kv heads; got ", shapes());
  CORELM_CHECK(k.size(2) >= q.size(2), ShapeError, op, ": kv length S must be >= query length T; got ", shapes());
  kernels::reference::AttentionDims dims;
  dims.batch = q.size(0);
  dims.q_heads = q.size(1);
  dims.kv_heads = k.size(1);
  dims.q_len = q.size(2);
  dims.kv_len = k.size(2);
  dims.head_dim = q.size(3);
  return dims;
}

}  // namespace corelm::ops::detail
