#include "kernels/cpu/reference/fused.h"

#include <cmath>
#include <vector>

namespace corelm::kernels::reference {

void fused_rms_norm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int64_t rows,
                    int64_t d, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sum_sq += double(xr[j]) * double(xr[j]);
    const float mean_sq = static_cast<float>(sum_sq / double(d));
    const float scale = 1.0f / std::sqrt(mean_sq + eps);
    for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] * scale) * weight[j];
  }
}

void fused_rope_inplace(float* x, int64_t heads, const RopeTable& table, int64_t pos) {
  const int64_t d = table.head_dim, half = d / 2;
  const float* c = table.cos_at(pos);
  const float* s = table.sin_at(pos);
  for (int64_t h = 0; h < heads; ++h) {
    float* xh = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      const float lo = xh[i], hi = xh[i + half];
      xh[i] = lo * c[i] - hi * s[i];
      xh[i + half] = hi * c[i] + lo * s[i];
    }
  }
}

void fused_swiglu(const float* gu, int64_t ldgu, float* y, int64_t ldy, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gu + r * ldgu;
    const float* up = gate + n;
    for (int64_t j = 0; j < n; ++j) y[r * ldy + j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
  }
}

void fused_attention_head(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t head,
                          int64_t pos, const CachedAttention& shape) {
  const int64_t D = shape.head_dim, keys = pos + 1;
  const int64_t kv_head = head / (shape.q_heads / shape.kv_heads);
  const float* K = k_cache + kv_head * shape.capacity * D;
  const float* V = v_cache + kv_head * shape.capacity * D;
  std::vector<double> scores(static_cast<size_t>(keys));
  double max_score = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) {
    double dot = 0.0;
    for (int64_t i = 0; i < D; ++i) dot += double(q[i]) * double(K[j * D + i]);
    scores[j] = dot * shape.scale;
    max_score = std::max(max_score, scores[j]);
  }
  double total = 0.0;
  for (double& s : scores) {
    s = std::exp(s - max_score);
    total += s;
  }
  for (int64_t i = 0; i < D; ++i) {
    double acc = 0.0;
    for (int64_t j = 0; j < keys; ++j) acc += scores[j] * double(V[j * D + i]);
    out[i] = static_cast<float>(acc / total);
  }
}

}  // namespace corelm::kernels::reference
