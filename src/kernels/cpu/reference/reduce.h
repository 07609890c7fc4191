// Reference sum reduction on a contiguous f32 buffer viewed as [outer, reduce, inner]:
// out[o, i] = sum over r of x[o, r, i]. Sums run in a fixed order (r ascending) in double, so
// the result does not depend on the thread count and stays accurate for long rows.
#pragma once
#include <cstdint>

namespace corelm::kernels::reference {

void sum_middle(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* out);

}  // namespace corelm::kernels::reference
