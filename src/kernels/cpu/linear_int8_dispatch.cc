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
#include "kernels/cpu/panel_tasks.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/reference/linear_int8.h"
#include "kernels/cpu/tile_emulation.h"

namespace corelm::kernels {
namespace {

constexpr int64_t kRowBlock = 384;          // rows per task (a multiple of the 6-row tile)
constexpr int64_t kPanelsPerBlock = 4;      // 256 output columns per task

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

bool has_vnni_path(Isa isa) { return static_cast<int>(isa) >= static_cast<int>(Isa::Avx512Bf16); }

// The int8 kernel of a path: AMX tiles, VNNI, vpmaddubsw (AVX2, also on AVX-512 without VNNI), or
// the scalar reference.
Isa int8_kernel_for(Isa isa) {
  switch (isa) {
    case Isa::Amx: return Isa::Amx;
    case Isa::Avx512Bf16: return Isa::Avx512Bf16;
    case Isa::Avx512:
    case Isa::Avx2: return Isa::Avx2;
    default: return Isa::Reference;
  }
}

// K as the packed layout stores it: whole tiles of 64 for AMX, groups of 4 for VNNI and AVX2.
int64_t padded_k(Isa kernel, int64_t k) {
  const int64_t unit = kernel == Isa::Amx ? kAmxKInt8 : kernel == Isa::Reference ? 1 : 4;
  return (k + unit - 1) / unit * unit;
}

using QuantizeRowsFn = void (*)(const float* X, int64_t m, int64_t ldx, int64_t k, int64_t kp, uint8_t* xq,
                                float* xscale);
using Int8BlockFn = void (*)(const LinearI8Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

// reference::quantize_row_int8 in the u8 form (q + 128, padding 128) the vector kernels take.
void quantize_rows_u8_scalar(const float* X, int64_t m, int64_t ldx, int64_t k, int64_t kp, uint8_t* xq,
                             float* xscale) {
  thread_local std::vector<int8_t> q;
  q.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    xscale[i] = reference::quantize_row_int8(X + i * ldx, k, q.data());
    for (int64_t t = 0; t < kp; ++t) xq[i * kp + t] = static_cast<uint8_t>((t < k ? q[t] : 0) + 128);
  }
}

// Quantizes X once, then runs `block` over the fixed task grid. Tile kernels load whole 16-row
// tiles, so the quantized rows are padded to a multiple of 16 (the padding rows' outputs are
// never stored).
void run_packed(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y, int64_t ldy,
                QuantizeRowsFn quantize, Int8BlockFn block) {
  // The calling thread's quantized copy of X; grows to the largest call, then is reused.
  thread_local std::vector<uint8_t> xq;
  thread_local std::vector<float> xscale;
  const int64_t kp = W.k_padded, rows = (m + 15) / 16 * 16;
  if (static_cast<int64_t>(xq.size()) < rows * kp) xq.resize(static_cast<size_t>(rows * kp));
  if (static_cast<int64_t>(xscale.size()) < m) xscale.resize(static_cast<size_t>(m));
  quantize(X, m, ldx, W.k, kp, xq.data(), xscale.data());
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
  run_panel_tasks(m, blocks(W.n, kInt8Panel), kRowBlock, kPanelsPerBlock,
                  [&](int64_t m0, int64_t m1, int64_t p0, int64_t p1) { block(a, m0, m1, p0, p1); });
}

void check_packing(const PackedLinearI8& W);

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

PackedLinearI8 pack_linear_int8(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias) {
  return pack_linear_int8(W, n, k, ldw, bias, int8_kernel_for(active_isa()));
}

PackedLinearI8 pack_linear_int8(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Isa kernel) {
  CORELM_CHECK(static_cast<int>(kernel) <= static_cast<int>(detected_isa()), ValueError, "pack_linear_int8: kernel ",
               isa_name(kernel), " is not supported by this CPU (best: ", isa_name(detected_isa()), ")");
  return pack_linear_int8_any_cpu(W, n, k, ldw, bias, kernel);
}

PackedLinearI8 pack_linear_int8_any_cpu(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias,
                                        Isa kernel) {
  CORELM_CHECK(int8_kernel_for(kernel) == kernel, ValueError, "pack_linear_int8: kernel ", isa_name(kernel),
               " has no int8 linear (use reference, avx2, avx512_bf16 or amx)");
  CORELM_CHECK(n >= 1 && k >= 1, ValueError, "pack_linear_int8: need n >= 1 and k >= 1, got n=", n, " k=", k);
  CORELM_CHECK(k <= kMaxLinearInt8K, ValueError, "pack_linear_int8: k=", k, " exceeds ", kMaxLinearInt8K,
               " (int32 accumulators could overflow)");
  CORELM_CHECK(ldw >= k, ValueError, "pack_linear_int8: row stride ldw=", ldw, " is less than k=", k);
  CORELM_CHECK(W != nullptr, ValueError, "pack_linear_int8: null weight pointer");
  PackedLinearI8 p;
  p.n = n;
  p.k = k;
  p.isa = kernel;
  p.k_padded = padded_k(kernel, k);
  p.scale.resize(static_cast<size_t>(n));
  p.row_sum.resize(static_cast<size_t>(n));
  if (bias) p.bias.assign(bias, bias + n);
  const int64_t panels = blocks(n, kInt8Panel);
  p.data.assign(static_cast<size_t>(kernel == Isa::Reference ? n * k : panels * kInt8Panel * p.k_padded), 0);
  thread_local std::vector<int8_t> q;
  q.resize(static_cast<size_t>(k));
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
  CORELM_CHECK(int8_kernel_for(W.isa) == W.isa, ValueError, "linear_int8: no kernel for packing ", isa_name(W.isa));
  check_packing(W);
  if (m == 0) return;
  CORELM_CHECK(X != nullptr && Y != nullptr, ValueError, "linear_int8: null input or output pointer");
  if (W.isa == Isa::Amx) return run_packed(X, m, ldx, W, Y, ldy, avx512_bf16::quantize_rows_u8, amx::linear_int8_block);
  if (W.isa == Isa::Avx512Bf16)
    return run_packed(X, m, ldx, W, Y, ldy, avx512_bf16::quantize_rows_u8, avx512_bf16::linear_int8_block);
  if (W.isa == Isa::Avx2) return run_packed(X, m, ldx, W, Y, ldy, quantize_rows_u8_scalar, avx2::linear_int8_block);
  reference::linear_int8(X, m, ldx, W, Y, ldy);
}

void linear_int8_tile_emulation(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y,
                                int64_t ldy) {
  CORELM_CHECK(W.isa == Isa::Amx, ValueError, "linear_int8_tile_emulation: weight packed for ", isa_name(W.isa),
               ", not amx");
  CORELM_CHECK(m >= 0 && ldx >= W.k && ldy >= W.n, ValueError, "linear_int8_tile_emulation: bad m/ldx/ldy");
  check_packing(W);
  if (m == 0) return;
  run_packed(X, m, ldx, W, Y, ldy, quantize_rows_u8_scalar, amx_emulated::linear_int8_block);
}

namespace {

void check_packing(const PackedLinearI8& W) {
  const bool panels = W.isa != Isa::Reference;
  const int64_t expected = panels ? blocks(W.n, kInt8Panel) * kInt8Panel * W.k_padded : W.n * W.k;
  CORELM_CHECK(static_cast<int64_t>(W.data.size()) == expected && W.k_padded == padded_k(W.isa, W.k) &&
                   static_cast<int64_t>(W.scale.size()) == W.n && static_cast<int64_t>(W.row_sum.size()) == W.n &&
                   (W.bias.empty() || static_cast<int64_t>(W.bias.size()) == W.n),
               ValueError, "linear_int8: packed weight is inconsistent (", W.data.size(), " values, ",
               W.scale.size(), " scales, ", W.row_sum.size(), " row sums, ", W.bias.size(), " biases; expected ",
               expected, " values for n=", W.n, " k=", W.k, " packed for ", isa_name(W.isa), ")");
}

}  // namespace

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
