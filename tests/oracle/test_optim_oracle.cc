// SGD and AdamW against torch.optim: tests/oracle/torch_optim.py feeds seeded parameters and a
// fixed sequence of 10 gradients through torch's optimizers; here the same gradients go through
// corelm::optim and the parameters are compared after every step (max_rel as in ErrorStats,
// worst over parameters and steps, bound 1e-5). Rows land in CORELM_BINARY_DIR/oracle/optim_errors.md.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "corelm/optim.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

constexpr double kParamTol = 1e-5;

const std::vector<std::string>& case_names() {
  static const std::vector<std::string> names = {
      "sgd",   "sgd_momentum_wd",      "sgd_nesterov_wd",          "sgd_dampening",
      "adamw", "adamw_torch_defaults", "adamw_no_decay_on_param_1"};
  return names;
}

const Fixture& optim_fixture() { return load_fixture("torch_optim.py", "optim.json"); }

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, const json& o,
                                                 std::vector<Tensor> params) {
  if (name.rfind("sgd", 0) == 0) {
    optim::SGDOptions opt;
    opt.lr = o.at("lr").get<float>();
    opt.momentum = o.value("momentum", 0.0f);
    opt.dampening = o.value("dampening", 0.0f);
    opt.weight_decay = o.value("weight_decay", 0.0f);
    opt.nesterov = o.value("nesterov", false);
    return std::make_unique<optim::SGD>(std::move(params), opt);
  }
  optim::AdamWOptions opt;
  opt.lr = o.at("lr").get<float>();
  opt.beta1 = o.at("beta1").get<float>();
  opt.beta2 = o.at("beta2").get<float>();
  opt.eps = o.at("eps").get<float>();
  opt.weight_decay = o.at("weight_decay").get<float>();
  auto adamw = std::make_unique<optim::AdamW>(std::move(params), opt);
  for (size_t i : o.value("no_decay_params", std::vector<size_t>{})) adamw->set_weight_decay(i, 0.0f);
  return adamw;
}

class OptimOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimOracle, TenStepsMatchTorch) {
  const Fixture& fx = optim_fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  const json& data = *fx.data;
  const std::string& name = GetParam();
  const json* c = nullptr;
  for (const json& k : data.at("cases"))
    if (k.at("name") == name) c = &k;
  ASSERT_NE(c, nullptr) << "case " << name << " missing from torch_optim.py's fixture";

  std::vector<Tensor> params;
  for (const json& p : data.at("params")) {
    params.push_back(tensor_from_json(p));
    params.back().set_requires_grad(true);
  }
  auto opt = make_optimizer(name, c->at("options"), params);

  const json& grads = data.at("grads");
  const json& after = c->at("after");
  ASSERT_EQ(grads.size(), after.size());
  ErrorStats worst, last;
  for (size_t step = 0; step < grads.size(); ++step) {
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(tensor_from_json(grads[step][i]));
    opt->step();
    ErrorStats this_step;
    for (size_t i = 0; i < params.size(); ++i)
      this_step.merge(ErrorStats::between(params[i].to_float_vector(),
                                          tensor_from_json(after[step][i]).to_float_vector()));
    EXPECT_LE(this_step.max_rel, kParamTol) << name << " after step " << step + 1;
    worst.merge(this_step);
    last = this_step;
  }

  std::printf("ORACLE optim %s params after %zu steps: worst max_abs=%s max_rel=%s, final max_abs=%s max_rel=%s\n",
              name.c_str(), grads.size(), format_error(worst.max_abs).c_str(),
              format_error(worst.max_rel).c_str(), format_error(last.max_abs).c_str(),
              format_error(last.max_rel).c_str());
  std::fflush(stdout);
  write_table_row("optim_errors.md",
                  "| optimizer case | options | worst max_abs (10 steps) | worst max_rel | final max_rel |\n"
                  "|---|---|---|---|---|\n",
                  case_names(), name,
                  "| " + name + " | `" + c->at("options").dump() + "` | " + format_error(worst.max_abs) +
                      " | " + format_error(worst.max_rel) + " | " + format_error(last.max_rel) + " |");
}

INSTANTIATE_TEST_SUITE_P(Torch, OptimOracle, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(OptimOracleFixture, CasesMatchTheScript) {
  const Fixture& fx = optim_fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  std::set<std::string> ours(case_names().begin(), case_names().end()), theirs;
  for (const json& c : fx.data->at("cases")) theirs.insert(c.at("name").get<std::string>());
  EXPECT_EQ(ours, theirs);
}

}  // namespace
}  // namespace corelm::oracle
