#include "kernels/cpu/reference/linear_attention.h"

#include <cmath>
#include <vector>

#include "corelm/thread_pool.h"

namespace corelm::kernels::reference {
namespace {

// Offsets of one (batch row, head) into the [B, H, T, D] layouts.
struct Rows {
  const LinearAttentionDims& d;
  int64_t group() const { return d.q_heads / d.kv_heads; }
  int64_t q(int64_t b, int64_t h, int64_t t) const { return ((b * d.q_heads + h) * d.seq_len + t) * d.state_dim; }
  int64_t o(int64_t b, int64_t h, int64_t t) const { return ((b * d.q_heads + h) * d.seq_len + t) * d.value_dim; }
  int64_t k(int64_t b, int64_t g, int64_t t) const { return ((b * d.kv_heads + g) * d.seq_len + t) * d.state_dim; }
  int64_t v(int64_t b, int64_t g, int64_t t) const { return ((b * d.kv_heads + g) * d.seq_len + t) * d.value_dim; }
  int64_t state(int64_t b, int64_t g) const { return (b * d.kv_heads + g) * d.state_dim * d.value_dim; }
};

// True when position t starts from a zero state instead of carrying S_{t-1}.
bool resets_at(const uint8_t* reset, const LinearAttentionDims& d, int64_t b, int64_t t) {
  return reset != nullptr && reset[b * d.seq_len + t] != 0;
}

// Runs the recurrence of one (b, g) forward. S holds S_{t-1} on entry to step t; after step t it
// holds S_t, which `visit(t, S)` sees (output, saving).
template <typename Visit>
void run_recurrence(const float* k, const float* v, const float* log_decay, const uint8_t* reset,
                    const float* initial_state, const Rows& r, int64_t b, int64_t g, std::vector<double>& S,
                    Visit&& visit) {
  const LinearAttentionDims& d = r.d;
  const int64_t ds = d.state_dim, dv = d.value_dim;
  S.assign(ds * dv, 0.0);
  if (initial_state != nullptr)
    for (int64_t i = 0; i < ds * dv; ++i) S[i] = initial_state[r.state(b, g) + i];
  for (int64_t t = 0; t < d.seq_len; ++t) {
    const bool reset_here = resets_at(reset, d, b, t);
    const float* kt = k + r.k(b, g, t);
    const float* vt = v + r.v(b, g, t);
    for (int64_t c = 0; c < ds; ++c) {
      const double decay = reset_here ? 0.0 : std::exp(static_cast<double>(log_decay[g * ds + c]));
      for (int64_t j = 0; j < dv; ++j) S[c * dv + j] = decay * S[c * dv + j] + double(kt[c]) * vt[j];
    }
    visit(t, S);
  }
}

}  // namespace

void linear_attention_forward(const float* q, const float* k, const float* v, const float* log_decay,
                              const uint8_t* reset, const float* initial_state, float* out, float* final_state,
                              const LinearAttentionDims& dims, float scale) {
  const Rows r{dims};
  const int64_t ds = dims.state_dim, dv = dims.value_dim, group = r.group();
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> S;
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / dims.kv_heads, g = bg % dims.kv_heads;
      run_recurrence(k, v, log_decay, reset, initial_state, r, b, g, S, [&](int64_t t, const std::vector<double>& St) {
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* qt = q + r.q(b, h, t);
          float* ot = out + r.o(b, h, t);
          for (int64_t j = 0; j < dv; ++j) {
            double acc = 0.0;
            for (int64_t c = 0; c < ds; ++c) acc += double(qt[c]) * St[c * dv + j];
            ot[j] = static_cast<float>(scale * acc);
          }
        }
      });
      if (final_state != nullptr) {
        if (dims.seq_len == 0) {  // no step ran: S is the initial state (or zeros)
          S.assign(ds * dv, 0.0);
          if (initial_state != nullptr)
            for (int64_t i = 0; i < ds * dv; ++i) S[i] = initial_state[r.state(b, g) + i];
        }
        for (int64_t i = 0; i < ds * dv; ++i) final_state[r.state(b, g) + i] = static_cast<float>(S[i]);
      }
    }
  });
}

void linear_attention_backward(const float* q, const float* k, const float* v, const float* log_decay,
                               const uint8_t* reset, const float* initial_state, const float* grad_out,
                               float* grad_q, float* grad_k, float* grad_v, float* grad_log_decay,
                               const LinearAttentionDims& dims, float scale) {
  const Rows r{dims};
  const int64_t T = dims.seq_len, ds = dims.state_dim, dv = dims.value_dim, group = r.group();
  const int64_t n_state = ds * dv;
  // One log-decay gradient per (b, g), summed over b in order at the end (batch-row invariant order).
  std::vector<double> decay_grad(dims.batch * dims.kv_heads * ds, 0.0);
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> S, states, dS(n_state);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / dims.kv_heads, g = bg % dims.kv_heads;
      states.assign(T * n_state, 0.0);  // states[t] = S_t
      run_recurrence(k, v, log_decay, reset, initial_state, r, b, g, S, [&](int64_t t, const std::vector<double>& St) {
        std::copy(St.begin(), St.end(), states.begin() + t * n_state);
      });
      std::fill(dS.begin(), dS.end(), 0.0);  // dL/dS_t, including everything after t
      double* da = decay_grad.data() + bg * ds;
      for (int64_t t = T - 1; t >= 0; --t) {
        const double* St = states.data() + t * n_state;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* qt = q + r.q(b, h, t);
          const float* go = grad_out + r.o(b, h, t);
          float* gq = grad_q + r.q(b, h, t);
          for (int64_t c = 0; c < ds; ++c) {
            double acc = 0.0;  // dq_t = scale · S_t dO_t
            for (int64_t j = 0; j < dv; ++j) acc += St[c * dv + j] * go[j];
            gq[c] = static_cast<float>(scale * acc);
            for (int64_t j = 0; j < dv; ++j) dS[c * dv + j] += double(scale) * qt[c] * go[j];
          }
        }
        const float* kt = k + r.k(b, g, t);
        const float* vt = v + r.v(b, g, t);
        float* gk = grad_k + r.k(b, g, t);
        float* gv = grad_v + r.v(b, g, t);
        for (int64_t c = 0; c < ds; ++c) {  // dk_t = dS_t v_t
          double acc = 0.0;
          for (int64_t j = 0; j < dv; ++j) acc += dS[c * dv + j] * vt[j];
          gk[c] = static_cast<float>(acc);
        }
        for (int64_t j = 0; j < dv; ++j) {  // dv_t = dS_tᵀ k_t
          double acc = 0.0;
          for (int64_t c = 0; c < ds; ++c) acc += dS[c * dv + j] * kt[c];
          gv[j] = static_cast<float>(acc);
        }
        // S_t = diag(λ) S_{t-1} + k vᵀ: dλ-term λ·<S_{t-1}, dS_t> per channel, and dS_{t-1} = λ dS_t.
        const bool has_prev = !resets_at(reset, dims, b, t) && (t > 0 || initial_state != nullptr);
        if (!has_prev) {
          std::fill(dS.begin(), dS.end(), 0.0);
          continue;
        }
        const double* prev = t > 0 ? states.data() + (t - 1) * n_state : nullptr;
        for (int64_t c = 0; c < ds; ++c) {
          const double decay = std::exp(static_cast<double>(log_decay[g * ds + c]));
          double acc = 0.0;
          for (int64_t j = 0; j < dv; ++j) {
            const double p = prev != nullptr ? prev[c * dv + j] : initial_state[r.state(b, g) + c * dv + j];
            acc += p * dS[c * dv + j];
            dS[c * dv + j] *= decay;
          }
          da[c] += decay * acc;
        }
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

}  // namespace corelm::kernels::reference
