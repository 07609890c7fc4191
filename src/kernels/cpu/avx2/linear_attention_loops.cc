// The linear-attention channel loops compiled with the AVX2 + FMA flags (see
// linear_attention_loops_impl.h).
#include "kernels/cpu/linear_attention_loops_impl.h"

namespace corelm::kernels::avx2 {

void la_diag_scores(const la::DiagBlock& b, float* A, int64_t lda) { diag_scores_impl(b, A, lda); }

void la_diag_grads(const la::DiagBlock& b, const float* dA, int64_t lda, float* dq, float* dk, float* da, float* kw) {
  diag_grads_impl(b, dA, lda, dq, dk, da, kw);
}

void la_step(float* state, const float* q, const float* k, const float* v, const float* decay, float* out,
             int64_t q_heads, int64_t kv_heads, int64_t ds, int64_t dv, float scale) {
  step_impl(state, q, k, v, decay, out, q_heads, kv_heads, ds, dv, scale);
}

}  // namespace corelm::kernels::avx2
