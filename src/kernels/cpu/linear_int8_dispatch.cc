// Packs int8 linear weights and runs the int8 kernel they were packed for. Activations are
// quantized once per call (row-local, so batch invariant); the column blocks then run on the
// thread pool. Integer accumulation is exact, so neither the block grid nor the thread count can
// change a result.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/reference/linear_int8.h"

namespace corelm::kernels {
namespace {

constexpr int64_t kRowBlock = 384;          // rows per task (a multiple of the 6-row tile)
constexpr int64_t kPanelsPerBlock = 4;      // 256 output columns per task

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

bool has_vnni_path(Isa isa) { return static_cast<int>(isa) >= static_cast<int>(Isa::Avx512Bf16); }

void run_vnni(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y, int64_t ldy) {
  // The calling thread's quantized copy of X; grows to the largest call, then is reused.
  thread_local std::vector<uint8_t> xq;
  thread_local std::vector<float> xscale;
  const int64_t kp = W.k_padded;
  if (static_cast<int64_t>(xq.size()) < m * kp) xq.resize(static_cast<size_t>(m * kp));
  if (static_cast<int64_t>(xscale.size()) < m) xscale.resize(static_cast<size_t>(m));
  avx512_bf16::quantize_rows_u8(X, m, ldx, W.k, kp, xq.data(), xscale.data());
  LinearI8Args a;
  a.xq = xq.data();
  a.xscale = xscale.data();
  a.kp = kp;
  a.W = W.data.data();
  a.wscale = W.scale.data();
  a.row_sum = W.row_sum.data();
  a.bias = W.bias.empty() ? nullptr : W.bias.data();
  a.n = W.n;
  a.Y = Y;
  a.ldy = ldy;
  const int64_t panels = blocks(W.n, kInt8Panel), col_blocks = blocks(panels, kPanelsPerBlock);
  const int64_t tasks = blocks(m, kRowBlock) * col_blocks;
  const auto task = [&](int64_t t) {
    const int64_t m0 = (t / col_blocks) * kRowBlock, p0 = (t % col_blocks) * kPanelsPerBlock;
    avx512_bf16::linear_int8_block(a, m0, std::min(m0 + kRowBlock, m), p0, std::min(p0 + kPanelsPerBlock, panels));
  };
  if (tasks == 1 || num_threads() == 1) {
    for (int64_t t = 0; t < tasks; ++t) task(t);
    return;
  }
  parallel_for(tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) task(t);
  });
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

PackedLinearI8 pack_linear_int8(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias) {
  return pack_linear_int8(W, n, k, ldw, bias, has_vnni_path(active_isa()) ? Isa::Avx512Bf16 : Isa::Reference);
}

PackedLinearI8 pack_linear_int8(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Isa kernel) {
  CORELM_CHECK(kernel == Isa::Reference || kernel == Isa::Avx512Bf16, ValueError, "pack_linear_int8: kernel ",
               isa_name(kernel), " has no int8 linear (use reference or avx512_bf16)");
  CORELM_CHECK(static_cast<int>(kernel) <= static_cast<int>(detected_isa()), ValueError, "pack_linear_int8: kernel ",
               isa_name(kernel), " is not supported by this CPU (best: ", isa_name(detected_isa()), ")");
  CORELM_CHECK(n >= 1 && k >= 1, ValueError, "pack_linear_int8: need n >= 1 and k >= 1, got n=", n, " k=", k);
  CORELM_CHECK(k <= kMaxLinearInt8K, ValueError, "pack_linear_int8: k=", k, " exceeds ", kMaxLinearInt8K,
               " (int32 accumulators could overflow)");
  CORELM_CHECK(ldw >= k, ValueError, "pack_linear_int8: row stride ldw=", ldw, " is less than k=", k);
  CORELM_CHECK(W != nullptr, ValueError, "pack_linear_int8: null weight pointer");
  PackedLinearI8 p;
  p.n = n;
  p.k = k;
  p.isa = kernel;
  p.k_padded = kernel == Isa::Reference ? k : (k + 3) / 4 * 4;
  p.scale.resize(static_cast<size_t>(n));
  p.row_sum.resize(static_cast<size_t>(n));
  if (bias) p.bias.assign(bias, bias + n);
  const int64_t panels = blocks(n, kInt8Panel);
  p.data.assign(static_cast<size_t>(kernel == Isa::Reference ? n * k : panels * kInt8Panel * p.k_padded), 0);
  std::vector<int8_t> q(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    p.scale[j] = reference::quantize_row_int8(W + j * ldw, k, q.data());
    CORELM_CHECK(!std::isnan(p.scale[j]), ValueError, "pack_linear_int8: weight row ", j,
                 " holds a non-finite value");
    int32_t sum = 0;
    for (int64_t t = 0; t < k; ++t) sum += q[t];
    p.row_sum[j] = sum;
    if (kernel == Isa::Reference) {
      std::copy(q.begin(), q.end(), p.data.begin() + j * k);
      continue;
    }
    int8_t* col = p.data.data() + (j / kInt8Panel) * p.k_padded * kInt8Panel + (j % kInt8Panel) * 4;
    for (int64_t t = 0; t < k; ++t) col[(t / 4) * 4 * kInt8Panel + t % 4] = q[t];
  }
  return p;
}

void linear_int8(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y, int64_t ldy) {
  CORELM_CHECK(m >= 0, ValueError, "linear_int8: negative row count m=", m);
  CORELM_CHECK(W.n >= 1 && W.k >= 1, ValueError, "linear_int8: the weight is not packed (n=", W.n, " k=", W.k, ")");
  CORELM_CHECK(ldx >= W.k && ldy >= W.n, ValueError, "linear_int8: strides ldx=", ldx, " ldy=", ldy,
               " are smaller than the weight's in_features=", W.k, " / out_features=", W.n);
  CORELM_CHECK(static_cast<int>(W.isa) <= static_cast<int>(detected_isa()), ValueError,
               "linear_int8: weight packed for ", isa_name(W.isa), " which this CPU does not support");
  const bool vnni = W.isa == Isa::Avx512Bf16;
  CORELM_CHECK(vnni || W.isa == Isa::Reference, ValueError, "linear_int8: no kernel for packing ", isa_name(W.isa));
  const int64_t expected = vnni ? blocks(W.n, kInt8Panel) * kInt8Panel * W.k_padded : W.n * W.k;
  CORELM_CHECK(static_cast<int64_t>(W.data.size()) == expected &&
                   W.k_padded == (vnni ? (W.k + 3) / 4 * 4 : W.k) &&
                   static_cast<int64_t>(W.scale.size()) == W.n && static_cast<int64_t>(W.row_sum.size()) == W.n &&
                   (W.bias.empty() || static_cast<int64_t>(W.bias.size()) == W.n),
               ValueError, "linear_int8: packed weight is inconsistent (", W.data.size(), " values, ",
               W.scale.size(), " scales, ", W.row_sum.size(), " row sums, ", W.bias.size(), " biases; expected ",
               expected, " values for n=", W.n, " k=", W.k, " packed for ", isa_name(W.isa), ")");
  if (m == 0) return;
  CORELM_CHECK(X != nullptr && Y != nullptr, ValueError, "linear_int8: null input or output pointer");
  if (vnni) return run_vnni(X, m, ldx, W, Y, ldy);
  reference::linear_int8(X, m, ldx, W, Y, ldy);
}

double int8_dot_peak_gops(double seconds) {
  if (!has_vnni_path(active_isa())) return 0.0;
  constexpr int64_t iters = 200'000;
  constexpr double ops_per_iter = 12.0 * 64 * 2;  // 12 chains x 64 u8*s8 products, 2 ops each
  volatile float sink = avx512_bf16::dpbusd_peak_loop(iters * 2);  // warm up the AVX-512 license
  std::vector<double> rates;
  double spent = 0;
  do {
    const double t0 = thread_cpu_seconds();
    sink = sink + avx512_bf16::dpbusd_peak_loop(iters);
    const double dt = thread_cpu_seconds() - t0;
    spent += dt;
    if (dt > 0) rates.push_back(ops_per_iter * iters / dt);
  } while (spent < seconds || rates.size() < 5);
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());  // the median
  return rates[rates.size() / 2] * 1e-9;
}

}  // namespace corelm::kernels
