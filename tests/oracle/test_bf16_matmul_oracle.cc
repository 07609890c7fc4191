// ops::matmul under bf16 compute against PyTorch (tests/oracle/torch_bf16_matmul.py), on every bf16
// kernel this CPU has (rounded, dpbf16): within fp32 summation error of the product of the operands
// as torch rounds them to bfloat16 (so the rounding is the same), and within bf16 output rounding of
// torch's own bf16 matmul (whose result is rounded to bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "corelm/autocast.h"
#include "corelm/ops.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

const Fixture& fixture() { return load_fixture("torch_bf16_matmul.py", "bf16_matmul.json"); }

std::vector<std::string> kernels_here() {
  std::vector<std::string> out = {"rounded"};
  const std::string saved = ops::bf16_gemm_kernel();
  try {
    ops::set_bf16_gemm_kernel("dpbf16");
    out.push_back("dpbf16");
  } catch (const ValueError&) {
  }
  ops::set_bf16_gemm_kernel(saved);
  return out;
}

TEST(Bf16MatmulOracle, MatchesTorchBfloat16OnEveryKernel) {
  const Fixture& fx = fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  const std::string saved = ops::bf16_gemm_kernel();
  const json& cases = fx.data->at("cases");
  ASSERT_GE(cases.size(), 4u);
  for (const std::string& kernel : kernels_here()) {
    ops::set_bf16_gemm_kernel(kernel);
    for (const json& c : cases) {
      const std::string name = c.at("name").get<std::string>() + " on " + kernel;
      const Tensor a = tensor_from_json(c.at("inputs")[0]), b = tensor_from_json(c.at("inputs")[1]);
      const bool ta = c.at("transpose_a").get<bool>(), tb = c.at("transpose_b").get<bool>();
      Tensor out;
      {
        ops::ComputeDTypeScope scope(ops::ComputeDType::BF16);
        out = ops::matmul(a, b, ta, tb);
      }
      const int64_t K = ta ? a.size(0) : a.size(1);
      const std::vector<float> got = out.to_float_vector();
      const ErrorStats exact = ErrorStats::between(got, tensor_from_json(c.at("exact_of_rounded")).to_float_vector());
      const ErrorStats vs_torch = ErrorStats::between(got, tensor_from_json(c.at("torch_bf16")).to_float_vector());
      std::printf("ORACLE bf16 matmul %s: vs f32 product of torch-rounded operands max_rel=%s, vs torch bf16 "
                  "matmul max_rel=%s\n", name.c_str(), format_error(exact.max_rel).c_str(),
                  format_error(vs_torch.max_rel).c_str());
      // fp32 summation-order error of K terms (random signs: ~sqrt(K) roundings), relative to the
      // largest output; a different rounding of even one operand would show up far above it.
      EXPECT_LE(exact.max_rel, 32.0 * std::sqrt(double(K)) * std::ldexp(1.0, -24)) << name;
      // torch's output is rounded to bf16, so it sits within 2^-8 of the exact product -- where torch
      // computes it that way. On CPUs without avx512_bf16 (e.g. Zen 3) torch 1.13's bf16 matmul
      // rounds partial sums to bf16 and lands farther from the exact product than 2^-8 itself;
      // there the exact product above is the yardstick and the torch figure is only reported.
      const ErrorStats torch_exact = ErrorStats::between(tensor_from_json(c.at("torch_bf16")).to_float_vector(),
                                                         tensor_from_json(c.at("exact_of_rounded")).to_float_vector());
      if (torch_exact.max_rel <= std::ldexp(1.0, -8))
        EXPECT_LE(vs_torch.max_rel, std::ldexp(1.0, -8)) << name;
      else
        std::printf("ORACLE bf16 matmul %s: torch's own bf16 matmul is %s off the exact product on this CPU "
                    "(partial sums rounded to bf16); compared with the exact product only\n",
                    name.c_str(), format_error(torch_exact.max_rel).c_str());
    }
  }
  ops::set_bf16_gemm_kernel(saved);
}

}  // namespace
}  // namespace corelm::oracle
