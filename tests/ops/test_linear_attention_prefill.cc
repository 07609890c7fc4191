// The inference backend's linear attention over a run of tokens (ops/inference_backend.h,
// linear_attention_tokens): a prefill of at least kChunkedPrefillMinTokens tokens per row runs the
// chunked parallel form (ops::linear_attention_prefill), shorter runs step the recurrence. The two
// forms agree to f32 rounding (checked here with the bound and the measured max abs/rel printed)
// for runs shorter than a chunk, not a multiple of it and longer than a repacking segment, from a
// zero state and from the state an earlier part left; the chunked form gives the training op's
// bits (ops::linear_attention with the same initial state) and its final state; rows do not
// depend on their batch neighbours, their cache rows or the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/thread_pool.h"
#include "ops/inference_backend.h"
#include "ops/linear_attention_step.h"

namespace corelm::ops {
namespace {

struct Shape4 {
  int64_t Hq, Hkv, ds, D;
  int64_t qkv() const { return (Hq + Hkv) * ds + Hkv * D; }
  int64_t out() const { return Hq * D; }
  int64_t state() const { return Hkv * ds * D; }
};

std::vector<float> seeded(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// log-decays in [-2, -0.001]: slow and fast channels, as the hybrid's init spreads them.
std::vector<float> log_decays(const Shape4& s, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, -0.001f);
  std::vector<float> a(static_cast<size_t>(s.Hkv * s.ds));
  for (float& x : a) x = dist(gen);
  return a;
}

// Rows of `tokens` fused q|k|v entries with row stride ld = qkv + 3 (a stride wider than the row,
// as a caller's buffer may be); q and k scaled 0.3 as projections of a normed hidden state are.
std::vector<float> qkv_rows(const Shape4& s, int64_t tokens, int64_t ld, uint64_t seed) {
  std::vector<float> x = seeded(static_cast<size_t>(tokens * ld), seed);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < (s.Hq + s.Hkv) * s.ds; ++c) x[t * ld + c] *= 0.3f;
  return x;
}

struct Result {
  std::vector<float> out, states;  // out [rows, T, ldo], states [cache rows, Hkv, ds, D]
};

// One backend call: `rows` rows of T tokens each (row b from qkv + b * T * ld), at positions
// start[b] ..; row b's state in cache row cache_row[b]. per_token: T calls of one token each
// instead (the recurrent form).
void call(const Shape4& s, const std::vector<float>& qkv, int64_t ld, int64_t T, const std::vector<int64_t>& start,
          const std::vector<int64_t>& cache_row, const std::vector<float>& a, const std::vector<float>& decay,
          bool per_token, Result& r) {
  const InferenceBackend& be = cpu_backend();
  const int64_t rows = static_cast<int64_t>(start.size()), ldo = s.out() + 5;
  r.out.assign(static_cast<size_t>(rows * T * ldo), 0.0f);
  const AttentionShape shape{s.Hq, s.Hkv, s.D, 1.0f};
  const StateLayerView view{r.states.data(), s.ds};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.ds));
  if (!per_token) {
    const TokenLayout layout{rows, T, 0, start.data(), cache_row.data()};
    be.linear_attention_tokens(qkv.data(), ld, r.out.data(), ldo, layout, shape, a.data(), decay.data(), scale, view);
    return;
  }
  std::vector<float> one_qkv(static_cast<size_t>(rows * ld)), one_out(static_cast<size_t>(rows * ldo));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> pos(start);
    for (int64_t b = 0; b < rows; ++b) {
      pos[b] += t;
      std::copy_n(qkv.data() + (b * T + t) * ld, ld, one_qkv.data() + b * ld);
    }
    const TokenLayout layout{rows, 1, 0, pos.data(), cache_row.data()};
    be.linear_attention_tokens(one_qkv.data(), ld, one_out.data(), ldo, layout, shape, a.data(), decay.data(), scale,
                               view);
    for (int64_t b = 0; b < rows; ++b) std::copy_n(one_out.data() + b * ldo, ldo, r.out.data() + (b * T + t) * ldo);
  }
}

struct Err {
  double abs = 0, rel = 0;
};
Err compare(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < got.size(); ++i) d = std::max(d, double(std::fabs(got[i] - want[i]))), m = std::max(m, double(std::fabs(want[i])));
  return {d, m > 0 ? d / m : d};
}

std::vector<float> decay_of(const std::vector<float>& a) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = std::exp(1.0f * a[i]);  // as ops::linear_attention_decay
  return d;
}

// Two parts per row: T1 tokens from position 0 (a zero state), then T2 from the state part one
// left. Chunked (one call per part) against stepped, outputs and final states.
TEST(LinearAttentionPrefill, ChunkedEqualsSteppedFromZeroAndFromACarriedState) {
  constexpr double kBound = 2e-6;  // f32 rounding of sums grouped differently, relative to the largest value
  for (const Shape4 s : {Shape4{2, 1, 32, 32}, Shape4{4, 2, 6, 8}}) {
    const std::vector<float> a = log_decays(s, 3), decay = decay_of(a);
    const int64_t ld = s.qkv() + 3;
    // T1 < chunk; T1 not a multiple of the chunk with T2 crossing a segment; T2 a multiple of it.
    for (auto [T1, T2] : {std::pair<int64_t, int64_t>{40, 17}, {150, 300}, {16, 128}}) {
      const std::vector<int64_t> start0{0, 0}, rows{1, 0};
      const std::vector<float> p1 = qkv_rows(s, 2 * T1, ld, 7 + T1), p2 = qkv_rows(s, 2 * T2, ld, 8 + T2);
      Result chunked{{}, std::vector<float>(static_cast<size_t>(2 * s.state()), 7.0f)};  // junk: position 0 zeroes it
      Result stepped = chunked;
      call(s, p1, ld, T1, start0, rows, a, decay, false, chunked);
      call(s, p1, ld, T1, start0, rows, a, decay, true, stepped);
      const Err e1 = compare(chunked.out, stepped.out), s1 = compare(chunked.states, stepped.states);
      const std::vector<int64_t> start1{T1, T1};
      const std::vector<float> mid = stepped.states;
      chunked.states = mid;  // part two from the same state, so the comparison is of part two alone
      call(s, p2, ld, T2, start1, rows, a, decay, false, chunked);
      call(s, p2, ld, T2, start1, rows, a, decay, true, stepped);
      const Err e2 = compare(chunked.out, stepped.out), s2 = compare(chunked.states, stepped.states);
      std::printf("chunked vs stepped (Hq %lld Hkv %lld ds %lld D %lld) T %lld from zero: out abs %.2e rel %.2e, "
                  "state rel %.2e | T %lld from its state: out abs %.2e rel %.2e, state rel %.2e\n",
                  (long long)s.Hq, (long long)s.Hkv, (long long)s.ds, (long long)s.D, (long long)T1, e1.abs, e1.rel,
                  s1.rel, (long long)T2, e2.abs, e2.rel, s2.rel);
      EXPECT_LE(e1.rel, kBound);
      EXPECT_LE(s1.rel, kBound);
      EXPECT_LE(e2.rel, kBound);
      EXPECT_LE(s2.rel, kBound);
      EXPECT_GT(e1.abs + e2.abs, 0.0) << "the chunked form should group the sums differently";
    }
  }
}

// The chunked prefill is the training op's kernel: ops::linear_attention on one row, with the
// state the first part left as initial_state, gives the same bits and the same final state.
TEST(LinearAttentionPrefill, ChunkedIsTheTrainingOpsBits) {
  if (active_isa() == Isa::Reference) GTEST_SKIP() << "the op runs the double-precision recurrence there";
  const Shape4 s{2, 1, 32, 32};
  const std::vector<float> a = log_decays(s, 5), decay = decay_of(a);
  const int64_t ld = s.qkv(), T1 = 90, T2 = 300;
  const std::vector<int64_t> rows{0};
  const std::vector<float> p1 = qkv_rows(s, T1, ld, 11), p2 = qkv_rows(s, T2, ld, 12);
  Result r{{}, std::vector<float>(static_cast<size_t>(s.state()), 0.0f)};
  // The op's view of the same tokens: [1, H, T, width] tensors.
  auto heads = [&](const std::vector<float>& x, int64_t T, int64_t off, int64_t H, int64_t w) {
    std::vector<float> t(static_cast<size_t>(H * T * w));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) std::copy_n(x.data() + i * ld + off + h * w, w, t.data() + (h * T + i) * w);
    return Tensor::from_vector(t, {1, H, T, w});
  };
  const Tensor at = Tensor::from_vector(a, {s.Hkv, s.ds});
  Tensor state;  // undefined: the op starts from zeros
  for (auto [p, T, pos] : {std::tuple{&p1, T1, int64_t{0}}, {&p2, T2, T1}}) {
    call(s, *p, ld, T, {pos}, rows, a, decay, false, r);
    Tensor final_state;
    const Tensor o = ops::linear_attention(heads(*p, T, 0, s.Hq, s.ds), heads(*p, T, s.Hq * s.ds, s.Hkv, s.ds),
                                           heads(*p, T, (s.Hq + s.Hkv) * s.ds, s.Hkv, s.D), at, Tensor(), state,
                                           &final_state, 1.0f / std::sqrt(static_cast<float>(s.ds)));
    const std::vector<float> want = o.to_float_vector();
    std::vector<float> got(want.size());
    const int64_t ldo = s.out() + 5;
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < T; ++i) std::copy_n(r.out.data() + i * ldo + h * s.D, s.D, got.data() + (h * T + i) * s.D);
    EXPECT_EQ(got, want) << "T " << T;
    EXPECT_EQ(r.states, final_state.to_float_vector()) << "T " << T;
    state = final_state;
  }
}

// Rows of one call at different positions, in swapped cache rows, at 1 and 2 threads: each row
// is what it is alone, bit for bit.
TEST(LinearAttentionPrefill, RowsAreBatchAndThreadInvariant) {
  const Shape4 s{2, 1, 32, 32};
  const std::vector<float> a = log_decays(s, 9), decay = decay_of(a);
  const int64_t ld = s.qkv(), T = 100, rows = 3, ldo = s.out() + 5;
  const std::vector<float> x = qkv_rows(s, rows * T, ld, 13), init = seeded(static_cast<size_t>(rows * s.state()), 14);
  const std::vector<int64_t> start{0, 37, 500}, cache_row{2, 0, 1};
  auto batched = [&](int threads) {
    set_num_threads(threads);
    Result r{{}, init};
    call(s, x, ld, T, start, cache_row, a, decay, false, r);
    set_num_threads(1);
    return r;
  };
  const Result one = batched(1), two = batched(2);
  EXPECT_EQ(one.out, two.out);
  EXPECT_EQ(one.states, two.states);
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t cr = cache_row[b];
    Result alone{{}, std::vector<float>(init.begin() + cr * s.state(), init.begin() + (cr + 1) * s.state())};
    const std::vector<float> xb(x.begin() + b * T * ld, x.begin() + (b + 1) * T * ld);
    call(s, xb, ld, T, {start[b]}, {0}, a, decay, false, alone);
    EXPECT_EQ(alone.out, std::vector<float>(one.out.begin() + b * T * ldo, one.out.begin() + (b + 1) * T * ldo))
        << "row " << b;
    EXPECT_EQ(alone.states, std::vector<float>(one.states.begin() + cr * s.state(), one.states.begin() + (cr + 1) * s.state()))
        << "row " << b;
  }
}

}  // namespace
}  // namespace corelm::ops
