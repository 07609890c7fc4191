// Packs 4-bit linear weights and runs the q4 kernel they were packed for. Activations are
// quantized once per call (block-local, so batch invariant); the column blocks then run on the
// thread pool. Each output's arithmetic is fixed by the reference contract, so neither the block
// grid nor the thread count can change a result.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "kernels/cpu/panel_tasks.h"
#include "kernels/cpu/linear_q4.h"
#include "kernels/cpu/reference/linear_q4.h"

namespace corelm::kernels {
namespace {

constexpr int64_t kRowBlock = 384;      // rows per task
constexpr int64_t kPanelsPerBlock = 16;  // 256 output columns per task

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// The q4 kernel of a path: VNNI from Avx512Bf16 up (AMX has no 4-bit tiles), vpmaddubsw on Avx2
// and on AVX-512 without VNNI, else the scalar reference.
Isa q4_kernel_for(Isa isa) {
  switch (isa) {
    case Isa::Amx:
    case Isa::Avx512Bf16: return Isa::Avx512Bf16;
    case Isa::Avx512:
    case Isa::Avx2: return Isa::Avx2;
    default: return Isa::Reference;
  }
}

void check_packing(const PackedLinearQ4& W) {
  const int64_t panels = blocks(W.n, kQ4Panel), nb = W.k_padded / kQ4Block;
  const int64_t codes = panels * kQ4Panel * W.k_padded / 2, scales = panels * kQ4Panel * nb;
  const bool with_min = W.format == Q4Format::WithMin;
  CORELM_CHECK(W.k_padded == blocks(W.k, kQ4Block) * kQ4Block && static_cast<int64_t>(W.codes.size()) == codes &&
                   static_cast<int64_t>(W.scale.size()) == scales &&
                   static_cast<int64_t>(W.min.size()) == (with_min ? scales : 0) &&
                   (W.bias.empty() || static_cast<int64_t>(W.bias.size()) == W.n),
               ValueError, "linear_q4: packed weight is inconsistent (", W.codes.size(), " code bytes, ",
               W.scale.size(), " scales, ", W.min.size(), " minima, ", W.bias.size(), " biases; expected ", codes,
               " code bytes and ", scales, " scales for n=", W.n, " k=", W.k, " format ", q4_format_name(W.format),
               ")");
}

using Q4BlockFn = void (*)(const LinearQ4Args&, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

// Quantizes X once, then runs `block` over the fixed task grid.
void run_packed(const float* X, int64_t m, int64_t ldx, const PackedLinearQ4& W, float* Y, int64_t ldy,
                Q4BlockFn block) {
  // The calling thread's quantized copy of X; grows to the largest call, then is reused.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xscale;
  thread_local std::vector<int32_t> xsum;
  const int64_t kp = W.k_padded, nb = kp / kQ4Block;
  if (static_cast<int64_t>(xq.size()) < m * kp) xq.resize(static_cast<size_t>(m * kp));
  if (static_cast<int64_t>(xscale.size()) < m * nb) {
    xscale.resize(static_cast<size_t>(m * nb));
    xsum.resize(static_cast<size_t>(m * nb));
  }
  reference::quantize_activation_rows_q8(X, m, ldx, W.k, kp, xq.data(), xscale.data(), xsum.data());
  LinearQ4Args a;
  a.xq = xq.data();
  a.xscale = xscale.data();
  a.xsum = xsum.data();
  a.kp = kp;
  a.nb = nb;
  a.codes = W.codes.data();
  a.scale = W.scale.data();
  a.min = W.format == Q4Format::WithMin ? W.min.data() : nullptr;
  a.bias = W.bias.empty() ? nullptr : W.bias.data();
  a.n = W.n;
  a.Y = Y;
  a.ldy = ldy;
  run_panel_tasks(m, blocks(W.n, kQ4Panel), kRowBlock, kPanelsPerBlock,
                  [&](int64_t m0, int64_t m1, int64_t p0, int64_t p1) { block(a, m0, m1, p0, p1); });
}

}  // namespace

const char* q4_format_name(Q4Format f) { return f == Q4Format::WithMin ? "min" : "sym"; }

Q4Format preferred_q4_format() {
  static const Q4Format format = [] {
    const char* env = std::getenv("CORELM_Q4_FORMAT");
    if (!env || !*env || std::string(env) == "min") return Q4Format::WithMin;
    CORELM_CHECK(std::string(env) == "sym", ValueError, "CORELM_Q4_FORMAT='", env, "': expected min or sym");
    return Q4Format::Symmetric;
  }();
  return format;
}

PackedLinearQ4 pack_linear_q4(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Q4Format format) {
  return pack_linear_q4(W, n, k, ldw, bias, format, q4_kernel_for(active_isa()));
}

PackedLinearQ4 pack_linear_q4(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Q4Format format,
                              Isa kernel) {
  CORELM_CHECK(q4_kernel_for(kernel) == kernel, ValueError, "pack_linear_q4: kernel ", isa_name(kernel),
               " has no q4 linear (use reference, avx2 or avx512_bf16)");
  CORELM_CHECK(static_cast<int>(kernel) <= static_cast<int>(detected_isa()), ValueError, "pack_linear_q4: kernel ",
               isa_name(kernel), " is not supported by this CPU (best: ", isa_name(detected_isa()), ")");
  CORELM_CHECK(n >= 1 && k >= 1, ValueError, "pack_linear_q4: need n >= 1 and k >= 1, got n=", n, " k=", k);
  CORELM_CHECK(ldw >= k, ValueError, "pack_linear_q4: row stride ldw=", ldw, " is less than k=", k);
  CORELM_CHECK(W != nullptr, ValueError, "pack_linear_q4: null weight pointer");
  PackedLinearQ4 p;
  p.n = n;
  p.k = k;
  p.isa = kernel;
  p.format = format;
  p.k_padded = blocks(k, kQ4Block) * kQ4Block;
  const int64_t panels = blocks(n, kQ4Panel), nb = p.k_padded / kQ4Block;
  // Padding (inputs past k, columns past n) holds the code of zero and scale 0: it adds nothing.
  const uint8_t zero_code = format == Q4Format::Symmetric ? 8 : 0;
  p.codes.assign(static_cast<size_t>(panels * kQ4Panel * p.k_padded / 2), static_cast<uint8_t>(zero_code * 0x11));
  p.scale.assign(static_cast<size_t>(panels * kQ4Panel * nb), 0);
  if (format == Q4Format::WithMin) p.min.assign(p.scale.size(), 0);
  if (bias) p.bias.assign(bias, bias + n);
  uint8_t codes[kQ4Block];
  for (int64_t j = 0; j < n; ++j)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t t0 = b * kQ4Block, len = std::min(kQ4Block, k - t0), s = q4_scale_index(p.k_padded, j, b);
      uint16_t unused = 0;
      CORELM_CHECK(reference::quantize_weight_block_q4(W + j * ldw + t0, len, format, codes, p.scale[s],
                                                       format == Q4Format::WithMin ? p.min[s] : unused),
                   ValueError, "pack_linear_q4: weight row ", j, " (inputs ", t0, "..", t0 + len - 1,
                   ") holds a non-finite value or one beyond the fp16 range of the block scale");
      for (int64_t t = t0; t < t0 + len; ++t) {
        uint8_t& byte = p.codes[q4_code_index(p.k_padded, j, t)];
        const int shift = q4_code_shift(t);
        byte = static_cast<uint8_t>((byte & ~(0x0f << shift)) | (codes[t - t0] << shift));
      }
    }
  return p;
}

void linear_q4(const float* X, int64_t m, int64_t ldx, const PackedLinearQ4& W, float* Y, int64_t ldy) {
  CORELM_CHECK(m >= 0, ValueError, "linear_q4: negative row count m=", m);
  CORELM_CHECK(W.n >= 1 && W.k >= 1, ValueError, "linear_q4: the weight is not packed (n=", W.n, " k=", W.k, ")");
  CORELM_CHECK(ldx >= W.k && ldy >= W.n, ValueError, "linear_q4: strides ldx=", ldx, " ldy=", ldy,
               " are smaller than the weight's in_features=", W.k, " / out_features=", W.n);
  CORELM_CHECK(q4_kernel_for(W.isa) == W.isa, ValueError, "linear_q4: no kernel for packing ", isa_name(W.isa));
  CORELM_CHECK(static_cast<int>(W.isa) <= static_cast<int>(detected_isa()), ValueError, "linear_q4: weight packed for ",
               isa_name(W.isa), " which this CPU does not support");
  check_packing(W);
  if (m == 0) return;
  CORELM_CHECK(X != nullptr && Y != nullptr, ValueError, "linear_q4: null input or output pointer");
  if (W.isa == Isa::Avx512Bf16) return run_packed(X, m, ldx, W, Y, ldy, avx512_bf16::linear_q4_block);
  if (W.isa == Isa::Avx2) return run_packed(X, m, ldx, W, Y, ldy, avx2::linear_q4_block);
  reference::linear_q4(X, m, ldx, W, Y, ldy);
}

void linear_q4_vnni_emulation(const float* X, int64_t m, int64_t ldx, const PackedLinearQ4& W, float* Y,
                              int64_t ldy) {
  CORELM_CHECK(m >= 0 && ldx >= W.k && ldy >= W.n, ValueError, "linear_q4_vnni_emulation: bad m/ldx/ldy");
  check_packing(W);
  if (m > 0) run_packed(X, m, ldx, W, Y, ldy, vnni_emulated::linear_q4_block);
}

}  // namespace corelm::kernels
