// The fused LM-head losses (full and sampled softmax) against PyTorch's F.cross_entropy over the
// explicit logits (tests/oracle/torch_lm_loss.py): loss and both gradients.
#include <gtest/gtest.h>

#include <cmath>

#include "corelm/ops.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

TEST(LmLossOracle, MatchesTorchCrossEntropyOverExplicitLogits) {
  const Fixture& fx = load_fixture("torch_lm_loss.py", "lm_loss.json");
  CORELM_REQUIRE_FIXTURE(fx);
  const json& d = *fx.data;
  const Tensor targets = tensor_from_json(d.at("targets"));
  for (const json& c : d.at("cases")) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    Tensor hidden = tensor_from_json(d.at("hidden")), weight = tensor_from_json(d.at("weight"));
    hidden.set_requires_grad(true);
    weight.set_requires_grad(true);
    Tensor loss = name == "full" ? ops::linear_cross_entropy(hidden, weight, targets)
                                 : ops::sampled_linear_cross_entropy(hidden, weight, targets,
                                                                     tensor_from_json(d.at("candidates")),
                                                                     tensor_from_json(d.at("log_correction")));
    loss.backward();
    const double ref = c.at("loss").get<double>();
    EXPECT_NEAR(loss.item(), ref, 1e-5 * std::fabs(ref));
    const ErrorStats gh = ErrorStats::between(hidden.grad().to_float_vector(),
                                              tensor_from_json(c.at("grad_hidden")).to_float_vector());
    const ErrorStats gw = ErrorStats::between(weight.grad().to_float_vector(),
                                              tensor_from_json(c.at("grad_weight")).to_float_vector());
    EXPECT_LE(gh.max_rel, 1e-4);
    EXPECT_LE(gw.max_rel, 1e-4);
    std::printf("ORACLE lm_loss=%s loss_abs_diff=%s grad_hidden max_rel=%s grad_weight max_rel=%s\n", name.c_str(),
                format_error(std::fabs(loss.item() - ref)).c_str(), format_error(gh.max_rel).c_str(),
                format_error(gw.max_rel).c_str());
  }
}

}  // namespace
}  // namespace corelm::oracle
