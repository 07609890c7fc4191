// Reference kernel for rotary position embeddings, HF Llama/Qwen "rotate half" convention.
// Numerics follow HF on purpose (not higher precision): inv_freq_i = 1 / theta^(2i/d) in f32,
// angle = f32(pos) * inv_freq_i in f32, cos/sin of that f32 angle.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

// x, y: contiguous [rows, seq, d] (rows = B*H), d even. Row element t sits at position
// position_offset + t. For i < d/2 (h = d/2):
//   y[i]   = x[i]   * cos - x[i+h] * sin
//   y[i+h] = x[i+h] * cos + x[i]   * sin
// `inverse` rotates by -angle instead (the backward of the forward rotation). x may equal y.
void rope_apply(const float* x, float* y, int64_t rows, int64_t seq, int64_t d, float theta,
                int64_t position_offset, bool inverse);

}  // namespace corelm::kernels::reference
