// ops::sliding_window_attention: the blocked kernel against the naive reference (values and
// gradients) on every ISA path, window <= 0 against causal_attention, document isolation against
// running each document alone, batch/thread invariance, finite differences, bad arguments, and
// ring-buffer decode (ops/sliding_attention_ring.h) against the op on the whole sequence.
//
// Window convention (see ops.h): the query at position i sees key j iff j <= i and i - j <= W,
// i.e. W + 1 keys counting its own. tests/oracle/test_sliding_attention_oracle.cc derives this from
// transformers 4.40.2's Mistral mask; here VisibleKeysFollowTheConvention only pins it down so a
// kernel change that drifts from it fails fast without Python.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gradcheck.h"
#include "common/tensor_factories.h"
#include "corelm/error.h"
#include "corelm/isa.h"
#include "corelm/ops.h"
#include "corelm/thread_pool.h"
#include "ops/sliding_attention_ring.h"

namespace corelm {
namespace {

using testing::expect_gradients_match;
using testing::leaf;
using testing::random_tensor;

std::vector<Isa> fast_isas() {
  std::vector<Isa> out;
  for (Isa isa : supported_isas())
    if (isa != Isa::Reference) out.push_back(isa);
  return out;
}

// Document ids [B, S] from per-row document lengths (each row's lengths sum to S).
Tensor doc_ids_from_lengths(const std::vector<std::vector<int64_t>>& rows, DType dtype = DType::I64) {
  std::vector<int64_t> ids;
  for (const auto& lengths : rows)
    for (size_t d = 0; d < lengths.size(); ++d) ids.insert(ids.end(), lengths[d], static_cast<int64_t>(d));
  const int64_t S = static_cast<int64_t>(ids.size() / rows.size());
  Tensor t = Tensor::from_vector(ids, {static_cast<int64_t>(rows.size()), S});
  return dtype == DType::I64 ? t : t.to(dtype);
}

struct Result {
  std::vector<float> out, dq, dk, dv;
};

Result run_with_grads(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g, int64_t window,
                      const Tensor& docs = Tensor(), bool causal = false) {
  Tensor q = q0.clone(), k = k0.clone(), v = v0.clone();
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  Tensor out = causal ? ops::causal_attention(q, k, v) : ops::sliding_window_attention(q, k, v, window, docs);
  out.backward(g);
  return {out.to_float_vector(), q.grad().to_float_vector(), k.grad().to_float_vector(), v.grad().to_float_vector()};
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, scale)) << what << " element " << i;
}

void expect_results_close(const Result& got, const Result& want, double fwd_tol, double grad_tol) {
  expect_close(got.out, want.out, fwd_tol, "out");
  expect_close(got.dq, want.dq, grad_tol, "dq");
  expect_close(got.dk, want.dk, grad_tol, "dk");
  expect_close(got.dv, want.dv, grad_tol, "dv");
}

struct Case {
  int64_t B, Hq, Hkv, T, S, D, W;
  std::vector<std::vector<int64_t>> docs;  // per-row document lengths; empty: no doc_ids
};

// GQA, T < W, T = W, T >> W, S > T, W wider than a 64-row block, W = 1, one query, and packed
// documents (1..5 per row, including documents of length 1).
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {2, 2, 1, 150, 150, 16, 16, {}},
      {1, 2, 1, 10, 10, 8, 32, {}},
      {1, 2, 1, 33, 33, 8, 33, {}},
      {2, 4, 2, 70, 97, 16, 20, {}},
      {1, 2, 1, 200, 200, 8, 100, {}},
      {1, 1, 1, 40, 40, 8, 1, {}},
      {1, 1, 1, 1, 65, 8, 7, {}},
      {1, 2, 1, 150, 150, 8, 24, {{150}}},
      {2, 2, 1, 130, 130, 8, 16, {{1, 129}, {60, 70}}},
      {1, 2, 1, 90, 90, 8, 0, {{30, 1, 20, 1, 38}}},
      {3, 2, 1, 75, 100, 16, 12, {{25, 50, 25}, {1, 1, 1, 1, 96}, {100}}},
      {1, 2, 1, 140, 140, 8, 70, {{3, 64, 1, 40, 32}}},
  };
  return c;
}

TEST(SlidingAttention, FastMatchesReferenceOnEveryPath) {
  for (size_t ci = 0; ci < cases().size(); ++ci) {
    const Case& c = cases()[ci];
    SCOPED_TRACE(::testing::Message() << "case " << ci << ": B" << c.B << " Hq" << c.Hq << " Hkv" << c.Hkv << " T"
                                      << c.T << " S" << c.S << " D" << c.D << " W" << c.W << " docs "
                                      << c.docs.size());
    const Tensor q = random_tensor({c.B, c.Hq, c.T, c.D}, 1 + ci), k = random_tensor({c.B, c.Hkv, c.S, c.D}, 2 + ci),
                 v = random_tensor({c.B, c.Hkv, c.S, c.D}, 3 + ci), g = random_tensor({c.B, c.Hq, c.T, c.D}, 4 + ci);
    const Tensor docs = c.docs.empty() ? Tensor() : doc_ids_from_lengths(c.docs, ci % 2 ? DType::I32 : DType::I64);
    Result want;
    {
      ScopedIsa ref(Isa::Reference);
      want = run_with_grads(q, k, v, g, c.W, docs);
    }
    for (Isa isa : fast_isas()) {
      SCOPED_TRACE(isa_name(isa));
      ScopedIsa scoped(isa);
      expect_results_close(run_with_grads(q, k, v, g, c.W, docs), want, 2e-6, 1e-5);
    }
  }
}

// With window <= 0 (or a window no query can exceed) and no doc_ids the op is causal attention:
// on the fast path the forward runs the same GEMMs and row softmax, so it is bitwise equal.
TEST(SlidingAttention, UnboundedWindowEqualsCausalAttention) {
  const Tensor q = random_tensor({2, 4, 130, 16}, 20), k = random_tensor({2, 2, 150, 16}, 21),
               v = random_tensor({2, 2, 150, 16}, 22), g = random_tensor({2, 4, 130, 16}, 23);
  std::vector<Isa> isas = fast_isas();
  isas.push_back(Isa::Reference);
  for (Isa isa : isas) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    const Result causal = run_with_grads(q, k, v, g, 0, Tensor(), /*causal=*/true);
    for (int64_t window : {0, -5, 149, 1000}) {
      SCOPED_TRACE(window);
      const Result swa = run_with_grads(q, k, v, g, window);
      if (isa != Isa::Reference) {
        EXPECT_EQ(swa.out, causal.out);
      }
      expect_results_close(swa, causal, 1e-6, 2e-6);
    }
  }
}

// Pins the convention on a case small enough to read: uniform scores (q = 0) and one-hot values
// make output column j the probability of key j, so the visible keys are the nonzero columns.
TEST(SlidingAttention, VisibleKeysFollowTheConvention) {
  const int64_t T = 6, S = 8, W = 3;
  std::vector<float> eye(S * S, 0.0f);
  for (int64_t j = 0; j < S; ++j) eye[j * S + j] = 1.0f;
  const Tensor v = Tensor::from_vector(eye, {1, 1, S, S});
  const Tensor q = Tensor::zeros({1, 1, T, S}), k = random_tensor({1, 1, S, S}, 30);
  const Tensor docs = doc_ids_from_lengths({{5, 3}});
  for (Isa isa : supported_isas()) {
    ScopedIsa scoped(isa);
    const std::vector<float> plain = ops::sliding_window_attention(q, k, v, W).to_float_vector();
    const std::vector<float> isolated = ops::sliding_window_attention(q, k, v, W, docs).to_float_vector();
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = S - T + t;
      for (int64_t j = 0; j < S; ++j) {
        const bool in_window = j <= i && i - j <= W;
        EXPECT_EQ(plain[t * S + j] > 0.0f, in_window) << isa_name(isa) << " query " << i << " key " << j;
        const bool same_doc = (i < 5) == (j < 5);
        EXPECT_EQ(isolated[t * S + j] > 0.0f, in_window && same_doc) << isa_name(isa) << " query " << i << " key " << j;
      }
    }
  }
}

// Packed documents never see each other: each document's rows equal the op run on that document
// alone (its own keys only), and its keys get no gradient from other documents' queries.
TEST(SlidingAttention, DocumentsMatchRunningEachAlone) {
  const std::vector<int64_t> lengths = {37, 1, 70, 12};
  const int64_t S = 120, Hq = 2, Hkv = 1, D = 8, W = 20;
  const Tensor q = random_tensor({1, Hq, S, D}, 40), k = random_tensor({1, Hkv, S, D}, 41),
               v = random_tensor({1, Hkv, S, D}, 42), g = random_tensor({1, Hq, S, D}, 43);
  const Tensor docs = doc_ids_from_lengths({lengths});
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    const Result packed = run_with_grads(q, k, v, g, W, docs);
    int64_t first = 0;
    for (int64_t len : lengths) {
      const auto part = [&](const Tensor& t) { return t.slice(2, first, first + len).contiguous(); };
      const Result alone = run_with_grads(part(q), part(k), part(v), part(g), W);
      const auto pick = [&](const std::vector<float>& all, int64_t heads) {
        std::vector<float> out;
        for (int64_t h = 0; h < heads; ++h)
          out.insert(out.end(), all.begin() + (h * S + first) * D, all.begin() + (h * S + first + len) * D);
        return out;
      };
      expect_results_close({pick(packed.out, Hq), pick(packed.dq, Hq), pick(packed.dk, Hkv), pick(packed.dv, Hkv)},
                           alone, 2e-6, 1e-5);
      first += len;
    }
  }
}

TEST(SlidingAttention, SequenceResultsIndependentOfBatchAndThreads) {
  const int64_t B = 3, Hq = 2, Hkv = 1, T = 150, D = 16, W = 40;
  const Tensor q = random_tensor({B, Hq, T, D}, 50), k = random_tensor({B, Hkv, T, D}, 51),
               v = random_tensor({B, Hkv, T, D}, 52), g = random_tensor({B, Hq, T, D}, 53);
  const Tensor docs = doc_ids_from_lengths({{T}, {50, 1, 99}, {149, 1}});
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    set_num_threads(1);
    const Result batch = run_with_grads(q, k, v, g, W, docs);
    set_num_threads(2);
    const Result threaded = run_with_grads(q, k, v, g, W, docs);
    set_num_threads(1);
    EXPECT_EQ(batch.out, threaded.out);
    EXPECT_EQ(batch.dq, threaded.dq);
    EXPECT_EQ(batch.dk, threaded.dk);
    EXPECT_EQ(batch.dv, threaded.dv);
    const auto one = [](const Tensor& t) { return t.slice(0, 1, 2).contiguous(); };
    const Result alone = run_with_grads(one(q), one(k), one(v), one(g), W, one(docs));
    const auto slice = [](const std::vector<float>& all, int64_t per_seq) {
      return std::vector<float>(all.begin() + per_seq, all.begin() + 2 * per_seq);
    };
    EXPECT_EQ(alone.out, slice(batch.out, Hq * T * D));
    EXPECT_EQ(alone.dq, slice(batch.dq, Hq * T * D));
    EXPECT_EQ(alone.dk, slice(batch.dk, Hkv * T * D));
    EXPECT_EQ(alone.dv, slice(batch.dv, Hkv * T * D));
  }
}

TEST(SlidingAttention, NoGradForwardEqualsGradForward) {
  const Tensor q = random_tensor({2, 2, 90, 8}, 60), k = random_tensor({2, 1, 100, 8}, 61),
               v = random_tensor({2, 1, 100, 8}, 62);
  const Tensor docs = doc_ids_from_lengths({{40, 60}, {100}});
  for (Isa isa : supported_isas()) {
    ScopedIsa scoped(isa);
    const Result with_grad = run_with_grads(q, k, v, Tensor::ones({2, 2, 90, 8}), 17, docs);
    EXPECT_EQ(ops::sliding_window_attention(q, k, v, 17, docs).to_float_vector(), with_grad.out) << isa_name(isa);
  }
}

TEST(SlidingAttention, GradientsMatchFiniteDifferences) {
  const Tensor q = random_tensor({1, 2, 6, 4}, 70), k = random_tensor({1, 1, 8, 4}, 71),
               v = random_tensor({1, 1, 8, 4}, 72);
  const Tensor docs = doc_ids_from_lengths({{3, 1, 4}});
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    expect_gradients_match(
        [](const std::vector<Tensor>& in) { return ops::sliding_window_attention(in[0], in[1], in[2], 2); },
        {leaf(q), leaf(k), leaf(v)});
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) {
          return ops::sliding_window_attention(in[0], in[1], in[2], 3, docs, 0.7f);
        },
        {leaf(q), leaf(k), leaf(v)});
  }
}

TEST(SlidingAttention, RejectsBadArguments) {
  const Tensor q = random_tensor({2, 2, 4, 8}, 80), k = random_tensor({2, 1, 6, 8}, 81),
               v = random_tensor({2, 1, 6, 8}, 82);
  const auto swa = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, const Tensor& docs = Tensor()) {
    return ops::sliding_window_attention(qq, kk, vv, 3, docs);
  };
  EXPECT_THROW(swa(q.reshape({2, 8, 8}), k, v), ShapeError);
  EXPECT_THROW(swa(q, k, random_tensor({2, 1, 5, 8}, 83)), ShapeError);
  EXPECT_THROW(swa(random_tensor({1, 2, 4, 8}, 84), k, v), ShapeError);
  EXPECT_THROW(swa(random_tensor({2, 3, 4, 8}, 85), random_tensor({2, 2, 6, 8}, 86), random_tensor({2, 2, 6, 8}, 87)),
               ShapeError);
  EXPECT_THROW(swa(random_tensor({2, 2, 7, 8}, 88), k, v), ShapeError);  // T > S
  EXPECT_THROW(swa(random_tensor({2, 2, 4, 4}, 89), k, v), ShapeError);  // head dims differ
  EXPECT_THROW(swa(q.to(DType::BF16), k, v), DTypeError);
  EXPECT_THROW(swa(q, k, v, doc_ids_from_lengths({{6}, {6}}).to(DType::F32)), DTypeError);
  EXPECT_THROW(swa(q, k, v, doc_ids_from_lengths({{4}, {4}})), ShapeError);  // [B, T] instead of [B, S]
  EXPECT_THROW(swa(q, k, v, doc_ids_from_lengths({{6}})), ShapeError);       // one row for B = 2
  EXPECT_THROW(swa(q, k, v, Tensor::from_vector(std::vector<int64_t>(6, 0), {6})), ShapeError);
  const Tensor decreasing = Tensor::from_vector(std::vector<int64_t>{0, 0, 1, 1, 1, 1, 0, 1, 1, 0, 2, 2}, {2, 6});
  try {
    swa(q, k, v, decreasing);
    ADD_FAILURE() << "decreasing doc_ids accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("non-decreasing"), std::string::npos) << e.what();
  }
}

// ---- ring-buffer decode ----

// Row p of q [1, Hq, T, D] as the decoder's [Hq * D] query row.
std::vector<float> query_row(const std::vector<float>& q, int64_t Hq, int64_t T, int64_t D, int64_t p) {
  std::vector<float> row(Hq * D);
  for (int64_t h = 0; h < Hq; ++h) std::copy_n(q.begin() + (h * T + p) * D, D, row.begin() + h * D);
  return row;
}

// Decodes positions 0..T-1 in chunks of `chunk` queries over a ring of `ring` slots (keys written
// at slot p % ring before the chunk attends) and checks every row against the op on the whole
// sequence. doc_start_of(p) gives the first position of p's document.
// Returns the decoded outputs [T, Hq, D] so callers can compare runs bit for bit.
std::vector<float> check_ring_decode(int64_t W, int64_t ring, int64_t chunk, const std::vector<int64_t>& doc_lengths,
                                     int64_t Hq = 2, int64_t Hkv = 1) {
  const int64_t T = 100, D = 8;
  const Tensor q = random_tensor({1, Hq, T, D}, 90), k = random_tensor({1, Hkv, T, D}, 91),
               v = random_tensor({1, Hkv, T, D}, 92);
  const Tensor docs = doc_lengths.empty() ? Tensor() : doc_ids_from_lengths({doc_lengths});
  std::vector<int64_t> doc_start(T, 0);
  for (int64_t p = 0, first = 0, d = 0, end = doc_lengths.empty() ? T : doc_lengths[0]; p < T; ++p) {
    if (p == end) first = p, end += doc_lengths[++d];
    doc_start[p] = first;
  }
  const std::vector<float> want = ops::sliding_window_attention(q, k, v, W, docs).to_float_vector();
  const std::vector<float> qv = q.to_float_vector(), kv = k.to_float_vector(), vv = v.to_float_vector();
  std::vector<float> k_ring(Hkv * ring * D, NAN), v_ring(Hkv * ring * D, NAN);
  ops::SlidingRingShape shape;
  shape.q_heads = Hq;
  shape.kv_heads = Hkv;
  shape.head_dim = D;
  shape.ring = ring;
  shape.window = W;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(D));
  double worst = 0.0;
  std::vector<float> decoded;
  for (int64_t start = 0; start < T;) {
    // A chunk never crosses a document start: decode starts each document afresh.
    int64_t n = std::min(chunk, T - start);
    while (doc_start[start + n - 1] != doc_start[start]) --n;
    std::vector<float> qrows, out(n * Hq * D);
    for (int64_t p = start; p < start + n; ++p) {
      for (int64_t h = 0; h < Hkv; ++h) {
        std::copy_n(kv.begin() + (h * T + p) * D, D, k_ring.begin() + (h * ring + ops::sliding_ring_slot(p, ring)) * D);
        std::copy_n(vv.begin() + (h * T + p) * D, D, v_ring.begin() + (h * ring + ops::sliding_ring_slot(p, ring)) * D);
      }
      const std::vector<float> row = query_row(qv, Hq, T, D, p);
      qrows.insert(qrows.end(), row.begin(), row.end());
    }
    shape.doc_start = doc_start[start];
    ops::sliding_ring_attention(qrows.data(), Hq * D, k_ring.data(), v_ring.data(), out.data(), Hq * D, n, start,
                                shape);
    for (int64_t p = start; p < start + n; ++p)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < D; ++i)
          worst = std::max(worst, std::fabs(double(out[((p - start) * Hq + h) * D + i]) - want[(h * T + p) * D + i]));
    decoded.insert(decoded.end(), out.begin(), out.end());
    start += n;
  }
  std::printf("[ring decode] W=%lld ring=%lld chunk=%lld docs=%zu Hq=%lld Hkv=%lld max_abs=%.3g\n", (long long)W,
              (long long)ring, (long long)chunk, doc_lengths.size(), (long long)Hq, (long long)Hkv, worst);
  EXPECT_LE(worst, 1e-5);
  return decoded;
}

TEST(SlidingRingDecode, TokenByTokenEqualsTheOp) {
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    check_ring_decode(16, 17, 1, {});   // the smallest ring for W = 16: W + 1 keys
    check_ring_decode(16, 23, 1, {});   // a ring larger than needed (slots wrap at other places)
    check_ring_decode(16, 20, 4, {});   // chunks of 4 queries need W + 4 slots
    check_ring_decode(16, 17, 1, {30, 1, 45, 24});  // bos isolation: documents restart the window
    check_ring_decode(16, 19, 3, {}, 4, 2);          // GQA with two kv heads
  }
}

TEST(SlidingRingDecode, IndependentOfThreads) {
  set_num_threads(1);
  const std::vector<float> one = check_ring_decode(16, 20, 4, {50, 50}, 4, 2);
  set_num_threads(2);
  const std::vector<float> two = check_ring_decode(16, 20, 4, {50, 50}, 4, 2);
  set_num_threads(1);
  EXPECT_EQ(one, two);
}

TEST(SlidingRingDecode, RejectsARingTooSmall) {
  std::vector<float> q(2 * 8), ring(1 * 16 * 8), out(2 * 8);
  ops::SlidingRingShape shape;
  shape.q_heads = 2;
  shape.kv_heads = 1;
  shape.head_dim = 8;
  shape.ring = 16;
  shape.window = 16;  // needs 17 slots once position 16 is reached
  EXPECT_NO_THROW(ops::sliding_ring_attention(q.data(), 16, ring.data(), ring.data(), out.data(), 16, 1, 15, shape));
  EXPECT_THROW(ops::sliding_ring_attention(q.data(), 16, ring.data(), ring.data(), out.data(), 16, 1, 16, shape),
               ValueError);
  EXPECT_EQ(ops::sliding_ring_required(1, 100, 16), 17);
  EXPECT_EQ(ops::sliding_ring_required(4, 100, 16), 20);
  EXPECT_EQ(ops::sliding_ring_required(1, 100, 16, 95), 6);
  shape.kv_heads = 3;
  EXPECT_THROW(ops::sliding_ring_attention(q.data(), 16, ring.data(), ring.data(), out.data(), 16, 1, 0, shape),
               ValueError);
}

}  // namespace
}  // namespace corelm
