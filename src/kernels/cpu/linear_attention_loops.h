// The channel loops of the chunked linear-attention kernel (linear_attention_fast.cc) that run
// per pair of positions, and the decode step: one body (linear_attention_loops_impl.h) built for
// baseline x86-64 and, declared here, with AVX2 + FMA (avx2/linear_attention_loops.cc; call only
// when active_isa() >= Avx2).
#pragma once
#include <cstdint>

namespace corelm::kernels::la {

// One sub-block [p, end) of a chunk: q and k point at the chunk's first row ([len, ds] rows), W at
// the decay table [C + 1, ds] (W[d][c] = exp(d · a_c)), doc_start[i] at the first key row i may see.
struct DiagBlock {
  const float* q;
  const float* k;
  const float* W;
  const int64_t* doc_start;
  int64_t ds, p, end;
};

}  // namespace corelm::kernels::la

namespace corelm::kernels::avx2 {

void la_diag_scores(const la::DiagBlock& b, float* A, int64_t lda);
void la_diag_grads(const la::DiagBlock& b, const float* dA, int64_t lda, float* dq, float* dk, float* da, float* kw);
void la_step(float* state, const float* q, const float* k, const float* v, const float* decay, float* out,
             int64_t q_heads, int64_t kv_heads, int64_t ds, int64_t dv, float scale);

}  // namespace corelm::kernels::avx2
