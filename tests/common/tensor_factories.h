// Seeded tensors for op tests: one definition instead of a copy per test file.
#pragma once
#include <cstdint>

#include "corelm/random.h"
#include "corelm/tensor.h"

namespace corelm::testing {

inline Tensor random_tensor(const Shape& shape, uint64_t seed, float stddev = 1.0f) {
  Generator gen(seed);
  return Tensor::randn(shape, gen, stddev);
}

inline Tensor randn(const Shape& shape, uint64_t seed) { return random_tensor(shape, seed); }

// A leaf that requires grad (gradcheck checks exactly those inputs).
inline Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

inline Tensor leaf(const Shape& shape, uint64_t seed) { return leaf(random_tensor(shape, seed)); }

}  // namespace corelm::testing
