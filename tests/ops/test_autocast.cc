// ComputeDTypeScope (corelm/autocast.h) and bf16 compute in ops::matmul / ops::linear: scopes nest
// and restore per thread; under BF16 every product -- forward and both backward products -- equals
// the product of the bf16-rounded operands (checked against double sums of the rounded values);
// under F32 nothing changes bit for bit. Every bf16 kernel this CPU has (rounded, dpbf16) passes
// the product tests; the fused LM-head loss and a small model's training agree between them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "common/tensor_factories.h"
#include "corelm/autocast.h"
#include "corelm/dtype.h"
#include "corelm/error.h"
#include "corelm/ops.h"
#include "kernels/cpu/gemm.h"

namespace corelm {
namespace {

using ops::ComputeDType;
using ops::ComputeDTypeScope;
using testing::random_tensor;

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// C = op(A) op(B) for 2-D matrices given row-major, in double, optionally from bf16-rounded values.
// `abs` receives sum |a||b| per element, the scale of the fp32 accumulation error.
std::vector<double> product(const Tensor& a, const Tensor& b, bool ta, bool tb, bool round,
                            std::vector<double>* abs) {
  const std::vector<float> va = a.to_float_vector(), vb = b.to_float_vector();
  const int64_t M = ta ? a.size(1) : a.size(0), K = ta ? a.size(0) : a.size(1);
  const int64_t N = tb ? b.size(0) : b.size(1);
  std::vector<double> c(static_cast<size_t>(M * N), 0.0);
  if (abs) abs->assign(c.size(), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) {
        float x = ta ? va[k * M + i] : va[i * K + k];
        float y = tb ? vb[j * K + k] : vb[k * N + j];
        if (round) x = round_bf16(x), y = round_bf16(y);
        c[i * N + j] += double(x) * double(y);
        if (abs) (*abs)[i * N + j] += std::fabs(double(x) * double(y));
      }
  return c;
}

// `got` equals the bf16 product within fp32 accumulation error, and the rounding is visible: the
// unrounded product differs from it by far more than that error somewhere.
void expect_bf16_product(const Tensor& got, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  std::vector<double> scale;
  const std::vector<double> want = product(a, b, ta, tb, true, &scale);
  const std::vector<double> exact = product(a, b, ta, tb, false, nullptr);
  const std::vector<float> g = got.to_float_vector();
  ASSERT_EQ(g.size(), want.size());
  const int64_t K = ta ? a.size(0) : a.size(1);
  double max_rounding_effect = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = 2.0 * K * std::ldexp(1.0, -24) * scale[i] + 1e-30;
    ASSERT_NEAR(g[i], want[i], tol) << "element " << i;
    max_rounding_effect = std::max(max_rounding_effect, std::fabs(exact[i] - want[i]) / tol);
  }
  EXPECT_GT(max_rounding_effect, 10.0) << "inputs too tame: bf16 rounding not observable";
}

TEST(Autocast, DefaultIsF32AndScopesNestAndRestore) {
  EXPECT_EQ(ops::compute_dtype(), ComputeDType::F32);
  {
    ComputeDTypeScope outer(ComputeDType::BF16);
    EXPECT_EQ(ops::compute_dtype(), ComputeDType::BF16);
    {
      ComputeDTypeScope inner(ComputeDType::F32);
      EXPECT_EQ(ops::compute_dtype(), ComputeDType::F32);
    }
    EXPECT_EQ(ops::compute_dtype(), ComputeDType::BF16);
  }
  EXPECT_EQ(ops::compute_dtype(), ComputeDType::F32);
}

TEST(Autocast, SettingIsPerThread) {
  ComputeDTypeScope scope(ComputeDType::BF16);
  ComputeDType seen_by_other = ComputeDType::BF16, other_inside = ComputeDType::F32;
  std::thread t([&] {
    seen_by_other = ops::compute_dtype();
    ComputeDTypeScope s(ComputeDType::BF16);
    other_inside = ops::compute_dtype();
  });
  t.join();
  EXPECT_EQ(seen_by_other, ComputeDType::F32);
  EXPECT_EQ(other_inside, ComputeDType::BF16);
  EXPECT_EQ(ops::compute_dtype(), ComputeDType::BF16);
}

TEST(Autocast, NamesParseAndBadNamesAreClear) {
  EXPECT_STREQ(ops::compute_dtype_name(ComputeDType::F32), "f32");
  EXPECT_STREQ(ops::compute_dtype_name(ComputeDType::BF16), "bf16");
  EXPECT_EQ(ops::parse_compute_dtype("f32"), ComputeDType::F32);
  EXPECT_EQ(ops::parse_compute_dtype("bf16"), ComputeDType::BF16);
  try {
    ops::parse_compute_dtype("fp16");
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fp16"), std::string::npos) << m;
    EXPECT_NE(m.find("bf16"), std::string::npos) << m;
  }
}

// The bf16 kernels this CPU runs.
std::vector<std::string> bf16_kernels() {
  std::vector<std::string> out = {"rounded"};
  if (kernels::bf16_gemm_supported(kernels::Bf16Gemm::Dpbf16)) out.push_back("dpbf16");
  if (kernels::bf16_gemm_supported(kernels::Bf16Gemm::Amx)) out.push_back("amx");
  return out;
}

// Sets the process's bf16 kernel for a scope.
class ScopedBf16Kernel {
 public:
  explicit ScopedBf16Kernel(const std::string& name) : saved_(ops::bf16_gemm_kernel()) { ops::set_bf16_gemm_kernel(name); }
  ~ScopedBf16Kernel() { ops::set_bf16_gemm_kernel(saved_); }

 private:
  std::string saved_;
};

TEST(Autocast, Bf16MatmulForwardIsTheProductOfRoundedOperands) {
  for (const std::string& kernel : bf16_kernels()) {
    SCOPED_TRACE(kernel);
    ScopedBf16Kernel use(kernel);
    ComputeDTypeScope scope(ComputeDType::BF16);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::string(ta ? "A^T" : "A") + (tb ? " B^T" : " B"));
        const int64_t M = 13, K = 70, N = 19;
        Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 1 + ta);
        Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 3 + tb);
        expect_bf16_product(ops::matmul(a, b, ta, tb), a, b, ta, tb);
      }
  }
}

TEST(Autocast, Bf16LinearFoldsBatchAndAddsBiasInF32) {
  Tensor x = random_tensor({2, 5, 48}, 7), w = random_tensor({33, 48}, 8), bias = random_tensor({33}, 9);
  Tensor y, y_no_bias;
  {
    ComputeDTypeScope scope(ComputeDType::BF16);
    y = ops::linear(x, w, bias);
    y_no_bias = ops::linear(x, w);
  }
  ASSERT_EQ(y.shape(), (Shape{2, 5, 33}));
  expect_bf16_product(ops::reshape(y_no_bias, {10, 33}), ops::reshape(x, {10, 48}), w, false, true);
  // The bias is added to the fp32 product in fp32 (the bias itself is not rounded).
  const std::vector<float> got = y.to_float_vector(), want = ops::add(y_no_bias, bias).to_float_vector();
  ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST(Autocast, Bf16GradientsAreProductsOfRoundedOperandsEvenOutsideTheScope) {
  for (const std::string& kernel : bf16_kernels()) {
    SCOPED_TRACE(kernel);
    ScopedBf16Kernel use(kernel);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::string(ta ? "A^T" : "A") + (tb ? " B^T" : " B"));
        const int64_t M = 11, K = 40, N = 17;
        Tensor a = testing::leaf(random_tensor(ta ? Shape{K, M} : Shape{M, K}, 11));
        Tensor b = testing::leaf(random_tensor(tb ? Shape{N, K} : Shape{K, N}, 12));
        Tensor g = random_tensor({M, N}, 13);
        Tensor c;
        {
          ComputeDTypeScope scope(ComputeDType::BF16);
          c = ops::matmul(a, b, ta, tb);
        }
        c.backward(g);  // outside the scope: the node keeps the forward's bf16 setting
        // dA = g op(B)^T (transposed back when A was), dB = op(A)^T g (likewise).
        const Tensor ad = a.detach(), bd = b.detach();
        if (!ta) expect_bf16_product(a.grad(), g, bd, false, !tb);
        else expect_bf16_product(a.grad(), bd, g, tb, true);
        if (!tb) expect_bf16_product(b.grad(), ad, g, !ta, false);
        else expect_bf16_product(b.grad(), g, ad, true, ta);
      }
  }
}

TEST(Autocast, Bf16GradientsOfABatchedLinear) {
  Tensor x = testing::leaf(random_tensor({3, 4, 24}, 21));
  Tensor w = testing::leaf(random_tensor({10, 24}, 22));
  Tensor g = random_tensor({3, 4, 10}, 23);
  {
    ComputeDTypeScope scope(ComputeDType::BF16);
    ops::linear(x, w).backward(g);
  }
  const Tensor g2 = ops::reshape(g, {12, 10}), x2 = ops::reshape(x.detach(), {12, 24});
  expect_bf16_product(ops::reshape(x.grad(), {12, 24}), g2, w.detach(), false, false);
  expect_bf16_product(w.grad(), g2, x2, true, false);
}

TEST(Autocast, F32IsBitwiseUnchanged) {
  const int64_t M = 9, K = 33, N = 14;
  Tensor a = testing::leaf(random_tensor({M, K}, 31)), b = testing::leaf(random_tensor({N, K}, 32));
  Tensor c;
  {
    ComputeDTypeScope outer(ComputeDType::BF16);
    ComputeDTypeScope scope(ComputeDType::F32);
    c = ops::matmul(a, b, false, true);
  }
  std::vector<float> want(static_cast<size_t>(M * N));
  kernels::gemm_f32(false, true, M, N, K, 1.0f, a.detach().data<float>(), K, b.detach().data<float>(), K, 0.0f,
                    want.data(), N);
  const std::vector<float> got = c.to_float_vector();
  ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  // And the gradient through the same path.
  Tensor g = random_tensor({M, N}, 33);
  c.backward(g);
  std::vector<float> want_ga(static_cast<size_t>(M * K));
  kernels::gemm_f32(false, false, M, K, N, 1.0f, g.data<float>(), N, b.detach().data<float>(), K, 0.0f,
                    want_ga.data(), K);
  const std::vector<float> ga = a.grad().to_float_vector();
  ASSERT_EQ(std::memcmp(ga.data(), want_ga.data(), want_ga.size() * sizeof(float)), 0);
}

TEST(Autocast, Bf16RowsAreBatchInvariant) {
  // A row's bf16 output does not depend on the other rows of the batch.
  Tensor x = random_tensor({16, 64}, 41), w = random_tensor({24, 64}, 42);
  ComputeDTypeScope scope(ComputeDType::BF16);
  const std::vector<float> all = ops::linear(x, w).to_float_vector();
  for (int64_t r : {0, 7, 15}) {
    const std::vector<float> one = ops::linear(x.slice(0, r, r + 1), w).to_float_vector();
    ASSERT_EQ(std::memcmp(one.data(), all.data() + r * 24, 24 * sizeof(float)), 0) << "row " << r;
  }
}

TEST(Autocast, Bf16KernelChoiceIsNamedAndSettable) {
  const std::string chosen = ops::bf16_gemm_kernel();
  EXPECT_TRUE(chosen == "rounded" || chosen == "dpbf16" || chosen == "amx") << chosen;
  {
    ScopedBf16Kernel use("rounded");
    EXPECT_EQ(ops::bf16_gemm_kernel(), "rounded");
    EXPECT_EQ(ops::bf16_gemm_kernel_source(), "set");
  }
  EXPECT_EQ(ops::bf16_gemm_kernel(), chosen);
  EXPECT_THROW(ops::set_bf16_gemm_kernel("fp8"), ValueError);
}

// The fused LM-head loss on the dpbf16 kernel: loss and both gradients within bf16 tolerance of the
// rounded-operand path (it also rounds the softmax gradient, so not bitwise), full and sampled.
TEST(Autocast, Bf16LmHeadLossAgreesBetweenKernels) {
  if (bf16_kernels().size() < 2) GTEST_SKIP() << "no vdpbf16ps on this CPU";
  const int64_t N = 300, H = 40, V = 700;  // N past one 256-row chunk
  const Tensor hidden = random_tensor({N, H}, 51), weight = random_tensor({V, H}, 52, 0.2f);
  std::vector<int64_t> ids(N), cand;
  for (int64_t i = 0; i < N; ++i) ids[i] = (i * 37) % V;
  for (int64_t v = 0; v < V; v += 3) cand.push_back(v);
  for (int64_t i = 0; i < N; ++i) ids[i] = cand[static_cast<size_t>(i * 7) % cand.size()];
  const Tensor targets = Tensor::from_vector(ids, {N});
  const Tensor candidates = Tensor::from_vector(cand, {static_cast<int64_t>(cand.size())});
  const Tensor corr = random_tensor({static_cast<int64_t>(cand.size())}, 53, 0.1f);
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "full");
    std::vector<float> loss, gh, gw;
    for (const char* kernel : {"rounded", "dpbf16"}) {
      ScopedBf16Kernel use(kernel);
      Tensor h = testing::leaf(hidden.clone()), w = testing::leaf(weight.clone());
      Tensor l;
      {
        ComputeDTypeScope scope(ComputeDType::BF16);
        l = sampled ? ops::sampled_linear_cross_entropy(h, w, targets, candidates, corr)
                    : ops::linear_cross_entropy(h, w, targets);
      }
      l.backward();
      loss.push_back(static_cast<float>(l.item()));
      const std::vector<float> a = h.grad().to_float_vector(), b = w.grad().to_float_vector();
      gh.insert(gh.end(), a.begin(), a.end());
      gw.insert(gw.end(), b.begin(), b.end());
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-5 * std::fabs(loss[0]));
    // Gradients: within bf16 rounding of the softmax gradient (2^-8 relative) of their size.
    auto expect_close = [](const std::vector<float>& v, const char* what) {
      const size_t n = v.size() / 2;
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < n; ++i) {
        max_diff = std::max(max_diff, std::fabs(double(v[i]) - v[n + i]));
        max_abs = std::max(max_abs, std::fabs(double(v[i])));
      }
      EXPECT_LT(max_diff, 1e-2 * max_abs) << what;
      EXPECT_GT(max_abs, 0) << what;
    };
    expect_close(gh, "grad hidden");
    expect_close(gw, "grad weight");
  }
}

// A small model (embedding -> linear -> SiLU -> linear -> fused LM-head loss, SGD) trained for 40
// steps in bf16 on each kernel: the loss curves agree within bf16 noise and both learn.
TEST(Autocast, SmallModelTrainsTheSameOnEveryBf16Kernel) {
  const int64_t V = 96, H = 32, F = 64, N = 64;
  std::vector<std::vector<double>> curves;
  for (const std::string& kernel : bf16_kernels()) {
    ScopedBf16Kernel use(kernel);
    std::vector<Tensor> params = {random_tensor({V, H}, 61, 0.3f), random_tensor({F, H}, 62, 0.2f),
                                  random_tensor({H, F}, 63, 0.2f), random_tensor({V, H}, 64, 0.2f)};
    std::vector<double> curve;
    for (int step = 0; step < 40; ++step) {
      std::vector<int64_t> in(N), out(N);
      for (int64_t i = 0; i < N; ++i) {
        in[i] = (i * 13 + step * 7) % V;
        out[i] = (in[i] * 5 + 1) % V;  // a learnable map
      }
      for (Tensor& p : params) p = testing::leaf(p.detach());
      Tensor loss;
      {
        ComputeDTypeScope scope(ComputeDType::BF16);
        Tensor x = ops::embedding(params[0], Tensor::from_vector(in, {N}));
        x = ops::linear(ops::silu(ops::linear(x, params[1])), params[2]);
        loss = ops::linear_cross_entropy(x, params[3], Tensor::from_vector(out, {N}));
      }
      loss.backward();
      curve.push_back(loss.item());
      for (Tensor& p : params) p = ops::sub(p.detach(), ops::scale(p.grad(), 0.5f));
    }
    curves.push_back(curve);
  }
  for (const auto& c : curves) EXPECT_LT(c.back(), 0.8 * c.front()) << "did not learn";
  for (size_t c = 1; c < curves.size(); ++c)
    for (size_t s = 0; s < curves[0].size(); ++s)
      EXPECT_NEAR(curves[0][s], curves[c][s], 2e-2 * curves[0][s]) << "step " << s << ", kernel " << c;
}

}  // namespace
}  // namespace corelm
