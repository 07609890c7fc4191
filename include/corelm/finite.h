// Finding NaN and infinity in float buffers at memory speed: the load-time weight check and the
// checkpoint check (a diverged model is never saved) share it.
#pragma once
#include <cstddef>

namespace corelm {

// Index of the first NaN or infinity among n floats, or n.
size_t first_non_finite(const float* p, size_t n);
// Copies n floats and returns first_non_finite of them, block by block (one pass over memory).
size_t copy_checking_finite(const float* src, float* dst, size_t n);

}  // namespace corelm
