#include "kernels/cpu/linear_attention_fast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "corelm/isa.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/linear_attention_loops_impl.h"  // the baseline build of the channel loops

namespace corelm::kernels::fast {
namespace {

// The channel loops of the pair blocks and the decode step: the AVX2 + FMA build on every fast
// path (Avx2 and up), the baseline build when called on the reference path (tests do).
bool use_avx2() { return active_isa() >= Isa::Avx2; }

// Sub-blocks of query rows inside a chunk. Pairs inside one sub-block are computed directly; a
// sub-block starting at p reaches the keys j < p through one GEMM after splitting the decay at p:
// W[i - j] = W[i - p] · W[p - j], both exponents ≤ 0.
constexpr int64_t kSub = kLinearAttentionSubBlock;

// One chunk of one row: where the document resets fall inside it.
struct Chunk {
  int64_t t0 = 0, len = 0;
  int64_t carry_rows = 0;  // positions t0 .. t0 + carry_rows - 1 read the state before the chunk
  int64_t key_from = 0;    // keys from t0 + key_from on (after the last reset) reach the state after it
  bool carries_state() const { return carry_rows == len; }  // the state before flows into the state after
};

// doc_start[i] (chunk-local): the first key position query t0 + i may see inside the chunk.
Chunk chunk_at(const uint8_t* reset_row, int64_t t0, int64_t len, int64_t* doc_start) {
  Chunk ch{t0, len, len, 0};
  int64_t start = 0;
  for (int64_t i = 0; i < len; ++i) {
    if (reset_row != nullptr && reset_row[t0 + i] != 0) {
      if (ch.carry_rows == len) ch.carry_rows = i;
      start = i;
    }
    doc_start[i] = start;
  }
  ch.key_from = start;
  return ch;
}

}  // namespace

// Per-task buffers (the workspace of the header): resize() keeps the vectors' storage, so a
// workspace reused for calls of at most the same sizes allocates nothing.
struct LinearAttentionWorkspace::Scratch {
  int64_t C = 0, ds = 0, dv = 0;
  std::vector<float> W;      // [C + 1, d_s]: W[d][c] = exp(d · a_c)
  std::vector<float> A, dA;  // [C, C]
  std::vector<float> rows, rows2, tmp;  // [C, d_s]
  std::vector<float> S, G, Gn;          // [d_s, d_v]
  std::vector<float> kw, da_chunk;      // [d_s]
  std::vector<float> qhat, dqhat;       // [kSub, d_s]: one sub-block's queries scaled to its start
  std::vector<float> khat, dkhat;       // [C, d_s]: the keys before it, scaled to the same point
  std::vector<int64_t> doc_start;       // [C]
  bool avx2 = use_avx2();
  Scratch(int64_t chunk, int64_t state_dim, int64_t value_dim) { resize(chunk, state_dim, value_dim); }
  void resize(int64_t chunk, int64_t state_dim, int64_t value_dim) {
    C = chunk, ds = state_dim, dv = value_dim;
    avx2 = use_avx2();
    W.resize((C + 1) * ds), A.resize(C * C), dA.resize(C * C);
    rows.resize(C * ds), rows2.resize(C * ds), tmp.resize(C * ds);
    S.resize(ds * dv), G.resize(ds * dv), Gn.resize(ds * dv);
    kw.resize(ds), da_chunk.resize(ds), qhat.resize(kSub * ds), dqhat.resize(kSub * ds);
    khat.resize(C * ds), dkhat.resize(C * ds), doc_start.resize(C);
  }

  void set_decay(const float* a) {
    for (int64_t d = 0; d <= C; ++d)
      for (int64_t c = 0; c < ds; ++c) W[d * ds + c] = std::exp(static_cast<float>(d) * a[c]);
  }
  const float* w(int64_t d) const { return W.data() + d * ds; }
};

namespace {
using Scratch = LinearAttentionWorkspace::Scratch;

// Rows [p, end) of a chunk; its first `rows` rows (those before any reset inside it) see the keys
// [jlo, p) of their document before p. rows = 0: no key before p is visible.
struct SubBlock {
  int64_t p = 0, end = 0, rows = 0, jlo = 0;
  int64_t keys() const { return p - jlo; }
};

SubBlock sub_block(const Chunk& ch, const std::vector<int64_t>& doc_start, int64_t p) {
  SubBlock sb{p, std::min(p + kSub, ch.len), 0, p};
  if (p == 0 || doc_start[p] >= p) return sb;
  sb.jlo = doc_start[p];
  while (p + sb.rows < sb.end && doc_start[p + sb.rows] < p) ++sb.rows;
  return sb;
}

// qhat[r] = q_{p+r} ⊙ W[r] for r < rows, khat[j - jlo] = k_j ⊙ W[p - j] for j in [jlo, p).
void load_hats(const float* q, const float* k, const Chunk& ch, const SubBlock& sb, Scratch& s) {
  const int64_t ds = s.ds;
  for (int64_t r = 0; r < sb.rows; ++r) product(s.qhat.data() + r * ds, q + (ch.t0 + sb.p + r) * ds, s.w(r), ds);
  for (int64_t j = sb.jlo; j < sb.p; ++j)
    product(s.khat.data() + (j - sb.jlo) * ds, k + (ch.t0 + j) * ds, s.w(sb.p - j), ds);
}

// A[i][j] = Σ_c q_i[c] k_j[c] W[i - j][c] for the pairs of one document, zeros elsewhere (rows and
// columns [0, len) of the chunk): a GEMM per sub-block for the keys before it, short loops over
// the pairs inside it (one three-way dot product each).
void pair_scores(const float* q, const float* k, const Chunk& ch, Scratch& s) {
  const int64_t C = s.C, ds = s.ds;
  for (int64_t i = 0; i < ch.len; ++i) std::fill(s.A.data() + i * C, s.A.data() + i * C + ch.len, 0.0f);
  for (int64_t p = 0; p < ch.len; p += kSub) {
    const SubBlock sb = sub_block(ch, s.doc_start, p);
    if (sb.rows > 0) {
      load_hats(q, k, ch, sb, s);
      gemm_f32(false, true, sb.rows, sb.keys(), ds, 1.0f, s.qhat.data(), ds, s.khat.data(), ds, 0.0f,
               s.A.data() + p * C + sb.jlo, C);
    }
    const la::DiagBlock block{q + ch.t0 * ds, k + ch.t0 * ds, s.W.data(), s.doc_start.data(), ds, p, sb.end};
    if (s.avx2)
      avx2::la_diag_scores(block, s.A.data(), C);
    else
      diag_scores_impl(block, s.A.data(), C);
  }
}

// One (sequence, kv head): the chunk loop of linear_attention_forward on the state S [d_s, d_v]
// (in place; state_zero: S holds zeros, so the first chunk skips the carried-state product).
void forward_group(const float* q, int64_t q_head_stride, const float* kr, const float* vr, const float* log_decay,
                   const uint8_t* reset_row, float* S, bool state_zero, float* out, int64_t out_head_stride,
                   float* chunk_states, int64_t T, int64_t group, float scale, int64_t chunk, Scratch& s) {
  const int64_t ds = s.ds, dv = s.dv, C = s.C, n_chunks = linear_attention_chunks(T, chunk);
  s.set_decay(log_decay);
  for (int64_t n = 0; n < n_chunks; ++n) {
    const int64_t t0 = n * C;
    const Chunk ch = chunk_at(reset_row, t0, std::min(C, T - t0), s.doc_start.data());
    if (chunk_states != nullptr) std::memcpy(chunk_states + n * ds * dv, S, ds * dv * sizeof(float));
    for (int64_t h = 0; h < group; ++h) {
      const float* qh = q + h * q_head_stride;
      float* oh = out + h * out_head_stride + t0 * dv;
      pair_scores(qh, kr, ch, s);
      gemm_f32(false, false, ch.len, dv, ch.len, scale, s.A.data(), C, vr + t0 * dv, dv, 0.0f, oh, dv);
      if (ch.carry_rows > 0 && !state_zero) {
        float* qhat = s.rows.data();  // q_t ⊙ W[t - t0 + 1]
        for (int64_t i = 0; i < ch.carry_rows; ++i) product(qhat + i * ds, qh + (t0 + i) * ds, s.w(i + 1), ds);
        gemm_f32(false, false, ch.carry_rows, dv, ds, scale, qhat, ds, S, dv, 1.0f, oh, dv);
      }
    }
    // The state after the chunk: the decayed carry (unless a reset dropped it) plus the keys of
    // the last document, each decayed by its distance to the chunk's end.
    if (ch.carries_state()) {
      for (int64_t c = 0; c < ds; ++c) {
        const float wl = s.w(ch.len)[c];
        for (int64_t j = 0; j < dv; ++j) S[c * dv + j] *= wl;
      }
    } else {
      std::fill(S, S + ds * dv, 0.0f);
    }
    const int64_t nk = ch.len - ch.key_from;
    float* khat = s.rows.data();
    for (int64_t i = 0; i < nk; ++i) product(khat + i * ds, kr + (t0 + ch.key_from + i) * ds, s.w(nk - 1 - i), ds);
    gemm_f32(true, false, ds, dv, nk, 1.0f, khat, ds, vr + (t0 + ch.key_from) * dv, dv, 1.0f, S, dv);
    state_zero = false;
  }
}

}  // namespace

LinearAttentionWorkspace::LinearAttentionWorkspace() = default;
LinearAttentionWorkspace::~LinearAttentionWorkspace() = default;

void linear_attention_forward(const float* q, const float* k, const float* v, const float* log_decay,
                              const uint8_t* reset, const float* initial_state, float* out, float* final_state,
                              float* chunk_states, const LinearAttentionDims& dims, float scale, int64_t chunk) {
  const int64_t T = dims.seq_len, ds = dims.state_dim, dv = dims.value_dim;
  const int64_t group = dims.q_heads / dims.kv_heads, n_chunks = linear_attention_chunks(T, chunk);
  const int64_t C = std::min(chunk, std::max<int64_t>(T, 1));
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    Scratch s(C, ds, dv);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / dims.kv_heads, g = bg % dims.kv_heads;
      float* S = s.S.data();
      const bool state_zero = initial_state == nullptr;
      if (state_zero)
        std::fill(s.S.begin(), s.S.end(), 0.0f);
      else
        std::memcpy(S, initial_state + bg * ds * dv, ds * dv * sizeof(float));
      const int64_t h0 = b * dims.q_heads + g * group;
      forward_group(q + h0 * T * ds, T * ds, k + bg * T * ds, v + bg * T * dv, log_decay + g * ds,
                    reset != nullptr ? reset + b * T : nullptr, S, state_zero, out + h0 * T * dv, T * dv,
                    chunk_states != nullptr ? chunk_states + bg * n_chunks * ds * dv : nullptr, T, group, scale, C, s);
      if (final_state != nullptr) std::memcpy(final_state + bg * ds * dv, S, ds * dv * sizeof(float));
    }
  });
}

void linear_attention_forward_group(const float* q, int64_t q_head_stride, const float* k, const float* v,
                                    const float* log_decay, float* state, bool state_zero, float* out,
                                    int64_t out_head_stride, int64_t seq_len, int64_t group, int64_t state_dim,
                                    int64_t value_dim, float scale, LinearAttentionWorkspace& ws, int64_t chunk) {
  const int64_t C = std::min(chunk, std::max<int64_t>(seq_len, 1));
  if (!ws.scratch_)
    ws.scratch_ = std::make_unique<Scratch>(C, state_dim, value_dim);
  else
    ws.scratch_->resize(C, state_dim, value_dim);
  forward_group(q, q_head_stride, k, v, log_decay, nullptr, state, state_zero, out, out_head_stride, nullptr, seq_len,
                group, scale, C, *ws.scratch_);
}

void linear_attention_backward(const float* q, const float* k, const float* v, const float* log_decay,
                               const uint8_t* reset, const float* chunk_states, const float* grad_out,
                               float* grad_q, float* grad_k, float* grad_v, float* grad_log_decay,
                               const LinearAttentionDims& dims, float scale, int64_t chunk) {
  const int64_t T = dims.seq_len, ds = dims.state_dim, dv = dims.value_dim;
  const int64_t group = dims.q_heads / dims.kv_heads, n_chunks = linear_attention_chunks(T, chunk);
  const int64_t C = std::min(chunk, std::max<int64_t>(T, 1));
  std::vector<double> decay_grad(dims.batch * dims.kv_heads * ds, 0.0);
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    Scratch s(C, ds, dv);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / dims.kv_heads, g = bg % dims.kv_heads;
      const float* kr = k + bg * T * ds;
      const float* vr = v + bg * T * dv;
      float* gk = grad_k + bg * T * ds;
      float* gv = grad_v + bg * T * dv;
      std::fill(gk, gk + T * ds, 0.0f);
      std::fill(gv, gv + T * dv, 0.0f);
      const uint8_t* reset_row = reset != nullptr ? reset + b * T : nullptr;
      s.set_decay(log_decay + g * ds);
      float* G = s.G.data();    // dL/dS after the current chunk
      float* Gn = s.Gn.data();  // dL/dS before it, being summed
      float* dac = s.da_chunk.data();
      double* da = decay_grad.data() + bg * ds;
      bool g_zero = true;
      for (int64_t n = n_chunks - 1; n >= 0; --n) {
        const int64_t t0 = n * C;
        const Chunk ch = chunk_at(reset_row, t0, std::min(C, T - t0), s.doc_start.data());
        const float* Sprev = chunk_states + (bg * n_chunks + n) * ds * dv;
        std::fill(s.Gn.begin(), s.Gn.end(), 0.0f);
        std::fill(s.da_chunk.begin(), s.da_chunk.end(), 0.0f);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* qh = q + (b * dims.q_heads + h) * T * ds;
          const float* go = grad_out + ((b * dims.q_heads + h) * T + t0) * dv;
          // dA[i][j] = scale dO_i · v_j; dv_j += scale Σ_i A[i][j] dO_i.
          gemm_f32(false, true, ch.len, ch.len, dv, scale, go, dv, vr + t0 * dv, dv, 0.0f, s.dA.data(), C);
          pair_scores(qh, kr, ch, s);
          gemm_f32(true, false, ch.len, dv, ch.len, scale, s.A.data(), C, go, dv, 1.0f, gv + t0 * dv, dv);
          // Through A: dq_i += dA_ij k_j ⊙ W[i-j], dk_j += dA_ij q_i ⊙ W[i-j], da += (i-j) dA_ij q_i ⊙ k_j ⊙ W[i-j];
          // pairs inside a sub-block one by one, the keys before it through the split at p (where
          // i - j = (i - p) + (p - j) splits the decay gradient into two direct sums).
          float* dq = s.rows2.data();
          std::fill(dq, dq + ch.len * ds, 0.0f);
          for (int64_t p = 0; p < ch.len; p += kSub) {
            const SubBlock sb = sub_block(ch, s.doc_start, p);
            const la::DiagBlock block{qh + t0 * ds, kr + t0 * ds, s.W.data(), s.doc_start.data(), ds, p, sb.end};
            if (s.avx2)
              avx2::la_diag_grads(block, s.dA.data(), C, dq, gk + t0 * ds, dac, s.kw.data());
            else
              diag_grads_impl(block, s.dA.data(), C, dq, gk + t0 * ds, dac, s.kw.data());
            if (sb.rows == 0) continue;
            load_hats(qh, kr, ch, sb, s);
            const float* dA_block = s.dA.data() + p * C + sb.jlo;
            gemm_f32(false, false, sb.rows, ds, sb.keys(), 1.0f, dA_block, C, s.khat.data(), ds, 0.0f,
                     s.dqhat.data(), ds);
            for (int64_t r = 0; r < sb.rows; ++r) {
              const float* dqh = s.dqhat.data() + r * ds;
              add_scaled_product(dq + (p + r) * ds, 1.0f, s.w(r), dqh, ds);
              add_scaled_product(dac, static_cast<float>(r), s.qhat.data() + r * ds, dqh, ds);
            }
            gemm_f32(true, false, sb.keys(), ds, sb.rows, 1.0f, dA_block, C, s.qhat.data(), ds, 0.0f,
                     s.dkhat.data(), ds);
            for (int64_t j = sb.jlo; j < p; ++j) {
              const float* dkh = s.dkhat.data() + (j - sb.jlo) * ds;
              add_scaled_product(gk + (t0 + j) * ds, 1.0f, s.w(p - j), dkh, ds);
              add_scaled_product(dac, static_cast<float>(p - j), s.khat.data() + (j - sb.jlo) * ds, dkh, ds);
            }
          }
          // Through the carried state: o_i += scale (q_i ⊙ W[i+1]) S_prev for the rows before a reset.
          if (ch.carry_rows > 0) {
            float* sd = s.tmp.data();  // S_prev dO_i
            gemm_f32(false, true, ch.carry_rows, ds, dv, 1.0f, go, dv, Sprev, dv, 0.0f, sd, ds);
            float* qhat = s.rows.data();
            for (int64_t i = 0; i < ch.carry_rows; ++i) {
              const float* qi = qh + (t0 + i) * ds;
              product(s.kw.data(), s.w(i + 1), sd + i * ds, ds);  // dq_i without the scale
              add_scaled(dq + i * ds, scale, s.kw.data(), ds);
              add_scaled_product(dac, scale * static_cast<float>(i + 1), qi, s.kw.data(), ds);
              product(qhat + i * ds, qi, s.w(i + 1), ds);
            }
            gemm_f32(true, false, ds, dv, ch.carry_rows, scale, qhat, ds, go, dv, 1.0f, Gn, dv);
          }
          std::memcpy(grad_q + ((b * dims.q_heads + h) * T + t0) * ds, dq, ch.len * ds * sizeof(float));
        }
        // Through the state after the chunk, S_end = W[len] ⊙ S_prev + Σ_j (k_j ⊙ W[end-j]) v_jᵀ.
        if (!g_zero) {
          const int64_t j0 = t0 + ch.key_from, nk = ch.len - ch.key_from;
          float* khat = s.rows.data();
          for (int64_t i = 0; i < nk; ++i) product(khat + i * ds, kr + (j0 + i) * ds, s.w(nk - 1 - i), ds);
          gemm_f32(false, false, nk, dv, ds, 1.0f, khat, ds, G, dv, 1.0f, gv + j0 * dv, dv);
          float* gvk = s.tmp.data();  // G v_j
          gemm_f32(false, true, nk, ds, dv, 1.0f, vr + j0 * dv, dv, G, dv, 0.0f, gvk, ds);
          for (int64_t i = 0; i < nk; ++i) {
            const float* wd = s.w(nk - 1 - i);
            product(s.kw.data(), wd, gvk + i * ds, ds);
            add_scaled(gk + (j0 + i) * ds, 1.0f, s.kw.data(), ds);
            add_scaled_product(dac, static_cast<float>(nk - 1 - i), kr + (j0 + i) * ds, s.kw.data(), ds);
          }
          if (ch.carries_state()) {
            const float* wl = s.w(ch.len);
            for (int64_t c = 0; c < ds; ++c) {
              float dot = 0.0f;
              for (int64_t j = 0; j < dv; ++j) dot += Sprev[c * dv + j] * G[c * dv + j];
              dac[c] += static_cast<float>(ch.len) * wl[c] * dot;
              add_scaled(Gn + c * dv, wl[c], G + c * dv, dv);
            }
          }
        }
        for (int64_t c = 0; c < ds; ++c) da[c] += dac[c];
        std::swap(s.G, s.Gn);
        G = s.G.data();
        Gn = s.Gn.data();
        g_zero = ch.carry_rows == 0;
      }
    }
  });
  for (int64_t g = 0; g < dims.kv_heads; ++g)
    for (int64_t c = 0; c < ds; ++c) {
      double acc = 0.0;
      for (int64_t b = 0; b < dims.batch; ++b) acc += decay_grad[(b * dims.kv_heads + g) * ds + c];
      grad_log_decay[g * ds + c] = static_cast<float>(acc);
    }
}

void linear_attention_step(float* state, const float* q, const float* k, const float* v, const float* decay,
                           float* out, int64_t q_heads, int64_t kv_heads, int64_t state_dim, int64_t value_dim,
                           float scale) {
  if (use_avx2())
    avx2::la_step(state, q, k, v, decay, out, q_heads, kv_heads, state_dim, value_dim, scale);
  else
    step_impl(state, q, k, v, decay, out, q_heads, kv_heads, state_dim, value_dim, scale);
}

}  // namespace corelm::kernels::fast
