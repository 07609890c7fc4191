// The AdamW update primitive: every path gives the same bits as the portable loop (separately
// rounded operations only), whatever n, alignment or thread count.
#include <cmath>
#include <cstring>
#include <limits>

#include "corelm/thread_pool.h"
#include "kernels/cpu/vec_fast.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

using kernels::fast::AdamWScalars;

AdamWScalars step_scalars(int step) {
  AdamWScalars s;
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, wd = 0.1;
  s.decay = static_cast<float>(1.0 - lr * wd);
  s.beta1 = static_cast<float>(b1);
  s.beta2 = static_cast<float>(b2);
  s.one_minus_b1 = static_cast<float>(1.0 - b1);
  s.one_minus_b2 = static_cast<float>(1.0 - b2);
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, step)));
  s.eps = 1e-8f;
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(b1, step)));
  return s;
}

class AdamWUpdate : public ::testing::TestWithParam<Isa> {
 protected:
  ScopedIsa isa_{GetParam()};
};

TEST_P(AdamWUpdate, EqualsThePortableLoopBitwise) {
  for (int64_t n : {1, 15, 16, 17, 100, 5000, 70001}) {
    auto w = random_floats(n, 1 + n), g = random_floats(n, 2 + n, 1e-2f), m = random_floats(n, 3 + n, 1e-3f);
    auto v = random_floats(n, 4 + n, 1e-4f);
    for (float& x : v) x = x * x;  // second moments are >= 0
    // Edge values: zero gradient and moments (denominator = eps), a denormal gradient, a huge one.
    g[0] = 0.0f, m[0] = 0.0f, v[0] = 0.0f;
    if (n > 2) g[1] = std::numeric_limits<float>::denorm_min(), g[2] = 1e18f;
    auto w2 = w, m2 = m, v2 = v;
    for (int step = 1; step <= 3; ++step) {
      const AdamWScalars s = step_scalars(step);
      kernels::fast::adamw_update(w.data(), g.data(), m.data(), v.data(), n, s);
      kernels::fast::adamw_update_portable(w2.data(), g.data(), m2.data(), v2.data(), n, s);
    }
    ASSERT_EQ(std::memcmp(w.data(), w2.data(), n * 4), 0) << "w, n=" << n;
    ASSERT_EQ(std::memcmp(m.data(), m2.data(), n * 4), 0) << "m, n=" << n;
    ASSERT_EQ(std::memcmp(v.data(), v2.data(), n * 4), 0) << "v, n=" << n;
    if (n > 2) {
      EXPECT_TRUE(std::isfinite(w[2]));
    }
  }
}

TEST_P(AdamWUpdate, DoesNotDependOnTheThreadCount) {
  const int64_t n = 300000;
  const auto w0 = random_floats(n, 7), g = random_floats(n, 8, 1e-2f);
  std::vector<float> results[2];
  for (int t = 1; t <= 2; ++t) {
    set_num_threads(t);
    auto w = w0;
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    kernels::fast::adamw_update(w.data(), g.data(), m.data(), v.data(), n, step_scalars(1));
    results[t - 1] = w;
  }
  set_num_threads(1);
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), n * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, AdamWUpdate, ::testing::ValuesIn(isa_paths()), isa_param_name);

}  // namespace
}  // namespace corelm::testing
