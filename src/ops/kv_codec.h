// The KV cache encodings as the model layer sees them: the formats, the bytes of one head vector,
// and encoding / decoding of head vectors. The contract and the reference code live in
// kernels/cpu/kv_quant.h; this header passes them up so nothing above ops includes kernels/.
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_quant.h"

namespace corelm::ops {

using kernels::KVFormat;

// Bytes of one head vector of head_dim values; ValueError naming the format when head_dim does
// not fit it.
inline int64_t kv_row_bytes(KVFormat f, int64_t head_dim) { return kernels::kv_row_bytes(f, head_dim); }
inline void kv_encode_row(KVFormat f, const float* x, int64_t head_dim, uint8_t* out) {
  kernels::kv_encode_row(f, x, head_dim, out);
}
inline void kv_decode_row(KVFormat f, const uint8_t* in, int64_t head_dim, float* x) {
  kernels::kv_decode_row(f, in, head_dim, x);
}

}  // namespace corelm::ops
