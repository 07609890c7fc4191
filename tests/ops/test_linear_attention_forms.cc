// The two forms of log-decay linear attention are equal: the chunked parallel kernel
// (kernels/cpu/linear_attention_fast.h) against the per-token recurrence in double
// (kernels/cpu/reference/linear_attention.h), forward, final state and all four gradients, over
// shapes that stress the chunking: T not a multiple of the chunk, T < chunk, T = 1, chunk = 1,
// widths that are not multiples of the vector block, decays near 0 and near -20, document resets
// inside a chunk and on a chunk boundary, an initial state, GQA. The chunked kernel runs under every
// ISA this CPU has: its channel loops have a baseline build (used under `reference`) and an AVX2
// build (avx2 and up).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "corelm/isa.h"
#include "corelm/random.h"
#include "kernels/cpu/linear_attention_fast.h"
#include "kernels/cpu/reference/linear_attention.h"

namespace corelm {
namespace {

using kernels::reference::LinearAttentionDims;

enum class Decay { Mixed, NearZero, NearMinus20 };

struct FormCase {
  std::string name;
  int64_t B, Hq, Hkv, T, ds, dv, chunk;
  Decay decay;
  std::vector<int64_t> boundaries;  // positions where a new document starts (every row)
  bool init;
  float scale;
};

std::vector<float> randn(int64_t n, Generator& gen, float stddev = 1.0f) {
  std::vector<float> x(static_cast<size_t>(n));
  for (float& f : x) f = gen.normal() * stddev;
  return x;
}

std::vector<float> log_decays(int64_t n, Decay mode, Generator& gen) {
  std::vector<float> a(static_cast<size_t>(n));
  for (float& x : a) {
    const float u = gen.uniform();
    switch (mode) {
      case Decay::Mixed: x = -std::exp(-6.0f + 9.0f * u); break;  // -0.0025 .. -8
      case Decay::NearZero: x = -1e-4f * u; break;
      case Decay::NearMinus20: x = -20.0f + 0.5f * u; break;
    }
  }
  a[0] = mode == Decay::NearMinus20 ? -20.0f : (mode == Decay::NearZero ? 0.0f : a[0]);  // the edge values themselves
  return a;
}

// max |ours - ref| / max |ref| (max_abs when ref is all zeros).
double rel_error(const std::vector<float>& ours, const std::vector<float>& ref) {
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(double(ours[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return max_ref > 0 ? max_abs / max_ref : max_abs;
}

struct Results {
  std::vector<float> out, final_state, dq, dk, dv, da;
};

TEST(LinearAttentionForms, ChunkedEqualsRecurrence) {
  const std::vector<FormCase> cases = {
      {"t_not_multiple_of_chunk", 1, 2, 1, 150, 32, 32, 64, Decay::Mixed, {}, false, 1.0f},
      {"t_less_than_chunk", 2, 2, 2, 10, 16, 8, 64, Decay::Mixed, {}, true, 1.0f},
      {"t_is_1", 2, 3, 1, 1, 8, 8, 64, Decay::Mixed, {}, true, 0.5f},
      {"chunk_1", 1, 2, 1, 23, 8, 16, 1, Decay::Mixed, {7}, true, 1.0f},
      {"odd_widths", 1, 4, 2, 77, 13, 5, 16, Decay::Mixed, {}, true, 0.25f},
      {"chunk_40_partial_sub_block", 1, 4, 2, 123, 13, 5, 40, Decay::Mixed, {20, 43, 90}, true, 0.25f},
      {"decay_near_0", 1, 2, 1, 200, 32, 32, 64, Decay::NearZero, {}, true, 1.0f},
      {"decay_near_minus_20", 1, 2, 1, 130, 32, 32, 64, Decay::NearMinus20, {}, true, 1.0f},
      {"resets_inside_and_on_chunks", 2, 2, 1, 200, 16, 16, 64, Decay::Mixed, {5, 37, 64, 100, 101, 190}, true, 1.0f},
      {"reset_at_0_drops_init", 1, 2, 1, 40, 8, 8, 16, Decay::NearZero, {0, 20}, true, 1.0f},
      {"many_docs_short_chunks", 1, 2, 1, 97, 8, 12, 7, Decay::NearZero, {3, 4, 14, 15, 16, 50, 96}, false, 1.0f},
  };
  double worst_fwd = 0, worst_grad = 0;
  for (const FormCase& c : cases) {
    SCOPED_TRACE(c.name);
    Generator gen(17);
    LinearAttentionDims d{c.B, c.Hq, c.Hkv, c.T, c.ds, c.dv};
    const auto q = randn(c.B * c.Hq * c.T * c.ds, gen, 0.5f), k = randn(c.B * c.Hkv * c.T * c.ds, gen, 0.5f);
    const auto v = randn(c.B * c.Hkv * c.T * c.dv, gen), go = randn(c.B * c.Hq * c.T * c.dv, gen);
    const auto a = log_decays(c.Hkv * c.ds, c.decay, gen);
    const auto init = randn(c.B * c.Hkv * c.ds * c.dv, gen);
    std::vector<uint8_t> reset(static_cast<size_t>(c.B * c.T), 0);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t : c.boundaries) reset[b * c.T + t] = 1;
    const uint8_t* rp = c.boundaries.empty() ? nullptr : reset.data();
    const float* ip = c.init ? init.data() : nullptr;

    auto run = [&](bool fast) {
      Results r;
      r.out.resize(go.size());
      r.final_state.resize(init.size());
      r.dq.resize(q.size());
      r.dk.resize(k.size());
      r.dv.resize(v.size());
      r.da.resize(a.size());
      if (fast) {
        std::vector<float> states(c.B * c.Hkv * kernels::fast::linear_attention_chunks(c.T, c.chunk) * c.ds * c.dv);
        kernels::fast::linear_attention_forward(q.data(), k.data(), v.data(), a.data(), rp, ip, r.out.data(),
                                                r.final_state.data(), states.data(), d, c.scale, c.chunk);
        kernels::fast::linear_attention_backward(q.data(), k.data(), v.data(), a.data(), rp, states.data(), go.data(),
                                                 r.dq.data(), r.dk.data(), r.dv.data(), r.da.data(), d, c.scale,
                                                 c.chunk);
      } else {
        kernels::reference::linear_attention_forward(q.data(), k.data(), v.data(), a.data(), rp, ip, r.out.data(),
                                                     r.final_state.data(), d, c.scale);
        kernels::reference::linear_attention_backward(q.data(), k.data(), v.data(), a.data(), rp, ip, go.data(),
                                                      r.dq.data(), r.dk.data(), r.dv.data(), r.da.data(), d, c.scale);
      }
      return r;
    };
    const Results ref = run(false);
    for (Isa isa : supported_isas()) {
      ScopedIsa scope(isa);
      const Results fast = run(true);
      const double e_out = rel_error(fast.out, ref.out), e_state = rel_error(fast.final_state, ref.final_state);
      const double e_dq = rel_error(fast.dq, ref.dq), e_dk = rel_error(fast.dk, ref.dk);
      const double e_dv = rel_error(fast.dv, ref.dv), e_da = rel_error(fast.da, ref.da);
      std::printf("FORMS %-28s %-9s out=%.2e state=%.2e dq=%.2e dk=%.2e dv=%.2e dlog_decay=%.2e\n",
                  c.name.c_str(), isa_name(isa), e_out, e_state, e_dq, e_dk, e_dv, e_da);
      EXPECT_LE(e_out, 2e-6);
      EXPECT_LE(e_state, 2e-6);
      EXPECT_LE(e_dq, 1e-5);
      EXPECT_LE(e_dk, 1e-5);
      EXPECT_LE(e_dv, 1e-5);
      EXPECT_LE(e_da, 1e-4);
      worst_fwd = std::max({worst_fwd, e_out, e_state});
      worst_grad = std::max({worst_grad, e_dq, e_dk, e_dv, e_da});
    }
  }
  std::printf("FORMS worst forward rel %.2e, worst gradient rel %.2e\n", worst_fwd, worst_grad);
}

// The bound above must be able to fail: a kernel that ignored the decay inside a chunk would be
// far off. (Feeding the chunked kernel a different decay than the recurrence shows the test's
// resolution: 1e-3 in log_decay is well above the bound.)
TEST(LinearAttentionForms, ComparisonResolvesASmallDecayChange) {
  Generator gen(5);
  const int64_t T = 100, ds = 16, dv = 16;
  LinearAttentionDims d{1, 1, 1, T, ds, dv};
  const auto q = randn(T * ds, gen), k = randn(T * ds, gen), v = randn(T * dv, gen);
  auto a = log_decays(ds, Decay::Mixed, gen);
  std::vector<float> ref(T * dv), fast(T * dv);
  kernels::reference::linear_attention_forward(q.data(), k.data(), v.data(), a.data(), nullptr, nullptr, ref.data(),
                                               nullptr, d, 1.0f);
  for (float& x : a) x -= 1e-3f;
  kernels::fast::linear_attention_forward(q.data(), k.data(), v.data(), a.data(), nullptr, nullptr, fast.data(),
                                          nullptr, nullptr, d, 1.0f);
  EXPECT_GT(rel_error(fast, ref), 1e-4);
}

}  // namespace
}  // namespace corelm
