#include "kernels/cpu/sliding_attention_fast.h"

#include <algorithm>
#include <vector>

#include "corelm/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_fast.h"

namespace corelm::kernels::fast {
namespace {

struct HeadDims {
  int64_t T, S, D, L;  // L: band columns per query row
  int64_t offset() const { return S - T; }  // query t sits at position offset() + t
};

// lo[t]: the first key query t sees. Document starts come from one scan of the row's doc ids
// (non-decreasing, checked by the op), so the visible keys of every query are the contiguous
// range lo[t] ..= offset + t, and lo is non-decreasing in t.
void first_visible_keys(const int64_t* doc_row, const HeadDims& hd, int64_t window, std::vector<int64_t>& lo) {
  lo.assign(static_cast<size_t>(hd.T), 0);
  int64_t doc_first = 0;
  for (int64_t j = 0; j < hd.S; ++j) {
    if (doc_row && j > 0 && doc_row[j] != doc_row[j - 1]) doc_first = j;
    const int64_t t = j - hd.offset();
    if (t < 0) continue;
    lo[t] = std::max(doc_first, window > 0 ? std::max<int64_t>(0, j - window) : 0);
  }
}

// The key range of the block of rows [r0, r1): lo of its first row ..= position of its last row.
struct KeyRange {
  int64_t first, count;
};
KeyRange block_keys(const std::vector<int64_t>& lo, int64_t r0, int64_t r1, const HeadDims& hd) {
  return {lo[r0], hd.offset() + r1 - lo[r0]};
}

// Rows [r0, r1) of the panel p (ld L, column c = key keys.first + c) hold scores; each becomes
// the softmax over its own visible keys, exact zeros elsewhere in the band.
void band_softmax_rows(float* p, int64_t r0, int64_t r1, const KeyRange& keys, const std::vector<int64_t>& lo,
                       const HeadDims& hd) {
  for (int64_t t = r0; t < r1; ++t) {
    float* row = p + (t - r0) * hd.L;
    const int64_t c0 = lo[t] - keys.first, visible = hd.offset() + t - lo[t] + 1;
    const float m = row_max(row + c0, visible);
    const double total = exp_shift_sum(row + c0, row + c0, visible, m);
    scale_inplace(row + c0, visible, static_cast<float>(1.0 / total));
    std::fill(row, row + c0, 0.0f);
    std::fill(row + c0 + visible, row + hd.L, 0.0f);
  }
}

// band: this head's [T, L] probabilities, or null (then scratch [block, L] holds one block).
void forward_head(const float* q, const float* k, const float* v, float* out, float* band, float* scratch,
                  const std::vector<int64_t>& lo, const HeadDims& hd, float scale) {
  const int64_t D = hd.D, L = hd.L;
  for (int64_t r0 = 0; r0 < hd.T; r0 += kSlidingRowBlock) {
    const int64_t r1 = std::min(hd.T, r0 + kSlidingRowBlock);
    const KeyRange keys = block_keys(lo, r0, r1, hd);
    float* p = band ? band + r0 * L : scratch;
    gemm_f32(false, true, r1 - r0, keys.count, D, scale, q + r0 * D, D, k + keys.first * D, D, 0.0f, p, L);
    band_softmax_rows(p, r0, r1, keys, lo, hd);
    gemm_f32(false, false, r1 - r0, D, keys.count, 1.0f, p, L, v + keys.first * D, D, 0.0f, out + r0 * D, D);
  }
}

// One query head's share of the backward; ds is scratch [block, L]. grad_k and grad_v were
// zeroed by the caller and accumulate block after block (beta = 1), a fixed order.
void backward_head(const float* q, const float* k, const float* v, const float* band, const float* go, float* gq,
                   float* gk, float* gv, float* ds, const std::vector<int64_t>& lo, const HeadDims& hd,
                   float scale) {
  const int64_t D = hd.D, L = hd.L;
  for (int64_t r0 = 0; r0 < hd.T; r0 += kSlidingRowBlock) {
    const int64_t r1 = std::min(hd.T, r0 + kSlidingRowBlock), rows = r1 - r0;
    const KeyRange keys = block_keys(lo, r0, r1, hd);
    const float* p = band + r0 * L;
    gemm_f32(false, true, rows, keys.count, D, 1.0f, go + r0 * D, D, v + keys.first * D, D, 0.0f, ds, L);
    for (int64_t t = r0; t < r1; ++t) {
      const int64_t c0 = lo[t] - keys.first, visible = hd.offset() + t - lo[t] + 1;
      const float* p_row = p + (t - r0) * L + c0;
      float* row = ds + (t - r0) * L;
      const float centre = static_cast<float>(dot(p_row, row + c0, visible));
      softmax_backward_row(p_row, row + c0, row + c0, visible, centre, scale);
      std::fill(row, row + c0, 0.0f);
      std::fill(row + c0 + visible, row + keys.count, 0.0f);
    }
    gemm_f32(false, false, rows, D, keys.count, 1.0f, ds, L, k + keys.first * D, D, 0.0f, gq + r0 * D, D);
    gemm_f32(true, false, keys.count, D, rows, 1.0f, ds, L, q + r0 * D, D, 1.0f, gk + keys.first * D, D);
    gemm_f32(true, false, keys.count, D, rows, 1.0f, p, L, go + r0 * D, D, 1.0f, gv + keys.first * D, D);
  }
}

}  // namespace

int64_t sliding_band_width(int64_t kv_len, int64_t window) {
  return window > 0 ? std::min(kv_len, window + kSlidingRowBlock) : kv_len;
}

void sliding_attention_forward(const float* q, const float* k, const float* v, float* out, float* band,
                               const AttentionDims& dims, const SlidingMask& mask, float scale) {
  const HeadDims hd{dims.q_len, dims.kv_len, dims.head_dim, sliding_band_width(dims.kv_len, mask.window)};
  const int64_t group = dims.q_heads / dims.kv_heads;
  parallel_for(dims.batch * dims.q_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(band ? 0 : static_cast<size_t>(kSlidingRowBlock * hd.L));
    std::vector<int64_t> lo;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / dims.q_heads, h = bh % dims.q_heads;
      const int64_t kv_offset = (b * dims.kv_heads + h / group) * hd.S * hd.D;
      first_visible_keys(mask.doc ? mask.doc + b * hd.S : nullptr, hd, mask.window, lo);
      forward_head(q + bh * hd.T * hd.D, k + kv_offset, v + kv_offset, out + bh * hd.T * hd.D,
                   band ? band + bh * hd.T * hd.L : nullptr, scratch.data(), lo, hd, scale);
    }
  });
}

void sliding_attention_backward(const float* q, const float* k, const float* v, const float* band,
                                const float* grad_out, float* grad_q, float* grad_k, float* grad_v,
                                const AttentionDims& dims, const SlidingMask& mask, float scale) {
  const HeadDims hd{dims.q_len, dims.kv_len, dims.head_dim, sliding_band_width(dims.kv_len, mask.window)};
  const int64_t group = dims.q_heads / dims.kv_heads;
  const int64_t q_head = hd.T * hd.D, kv_head = hd.S * hd.D;
  parallel_for(dims.batch * dims.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ds(static_cast<size_t>(kSlidingRowBlock * hd.L));
    std::vector<int64_t> lo;
    for (int64_t bkv = begin; bkv < end; ++bkv) {
      const int64_t b = bkv / dims.kv_heads, kvh = bkv % dims.kv_heads;
      first_visible_keys(mask.doc ? mask.doc + b * hd.S : nullptr, hd, mask.window, lo);
      std::fill(grad_k + bkv * kv_head, grad_k + (bkv + 1) * kv_head, 0.0f);
      std::fill(grad_v + bkv * kv_head, grad_v + (bkv + 1) * kv_head, 0.0f);
      for (int64_t r = 0; r < group; ++r) {
        const int64_t bh = b * dims.q_heads + kvh * group + r;
        backward_head(q + bh * q_head, k + bkv * kv_head, v + bkv * kv_head, band + bh * hd.T * hd.L,
                      grad_out + bh * q_head, grad_q + bh * q_head, grad_k + bkv * kv_head, grad_v + bkv * kv_head,
                      ds.data(), lo, hd, scale);
      }
    }
  });
}

int64_t ring_required_keys(int64_t T, int64_t start, int64_t window, int64_t doc_start) {
  const int64_t oldest = std::max<int64_t>({0, doc_start, window > 0 ? start - window : 0});
  return start + T - oldest;
}

void sliding_ring_attention(const float* q, int64_t ldq, const float* k_ring, const float* v_ring, float* out,
                            int64_t ldo, int64_t T, int64_t start, const RingAttention& shape) {
  const int64_t D = shape.head_dim, ring = shape.ring, group = shape.q_heads / shape.kv_heads;
  // Positions are consecutive, so the visible keys of a query occupy at most two runs of slots:
  // from the oldest key's slot to the end of the ring, then from slot 0.
  parallel_for(T * shape.q_heads, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / shape.q_heads, h = item % shape.q_heads;
      const int64_t pos = start + t;
      const int64_t lo = std::max<int64_t>({0, shape.doc_start, shape.window > 0 ? pos - shape.window : 0});
      const int64_t n = pos - lo + 1, slot = lo % ring;
      const int64_t first = std::min(n, ring - slot), second = n - first;
      if (static_cast<int64_t>(scores.size()) < n) scores.resize(static_cast<size_t>(n));
      const float* qh = q + t * ldq + h * D;
      float* oh = out + t * ldo + h * D;
      const float* kh = k_ring + (h / group) * ring * D;
      const float* vh = v_ring + (h / group) * ring * D;
      float* sc = scores.data();
      gemm_f32(false, true, 1, first, D, shape.scale, qh, D, kh + slot * D, D, 0.0f, sc, n);
      if (second > 0) gemm_f32(false, true, 1, second, D, shape.scale, qh, D, kh, D, 0.0f, sc + first, n);
      const float m = row_max(sc, n);
      const double total = exp_shift_sum(sc, sc, n, m);
      scale_inplace(sc, n, static_cast<float>(1.0 / total));
      gemm_f32(false, false, 1, D, first, 1.0f, sc, n, vh + slot * D, D, 0.0f, oh, D);
      if (second > 0) gemm_f32(false, false, 1, D, second, 1.0f, sc + first, n, vh, D, 1.0f, oh, D);
    }
  });
}

}  // namespace corelm::kernels::fast
