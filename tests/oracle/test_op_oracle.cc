// Every op of include/corelm/ops.h against PyTorch: tests/oracle/torch_ops.py writes seeded
// inputs, an upstream gradient, torch's output and torch's input gradients; here the same inputs
// go through our op, backward runs with the same upstream gradient, and both are compared.
// Errors are max_abs = max|ours - torch| and max_rel = max_abs / max|torch| (see ErrorStats),
// printed as one `ORACLE <case> ...` line per case and collected in
// CORELM_BINARY_DIR/oracle/op_errors.md. Bounds: forward max_rel <= 1e-5, gradients <= 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "corelm/ops.h"
#include "corelm/random.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

constexpr double kForwardTol = 1e-5;
constexpr double kGradTol = 1e-4;

using Inputs = std::vector<Tensor>;
struct OpCase {
  std::string name;
  std::function<Tensor(const Inputs&)> run;
};

// One entry per case of torch_ops.py, same names, same arguments.
const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = {
      // ---- shape ops ----
      {"reshape", [](const Inputs& x) { return ops::reshape(x[0], {4, 6}); }},
      {"reshape_of_transposed",
       [](const Inputs& x) { return ops::reshape(ops::transpose(x[0], 0, 1), {12}); }},
      {"transpose", [](const Inputs& x) { return ops::transpose(x[0], 1, 2); }},
      {"permute", [](const Inputs& x) { return ops::permute(x[0], {2, 0, 3, 1}); }},
      {"slice", [](const Inputs& x) { return ops::slice(x[0], 0, 1, 3); }},
      {"slice_step", [](const Inputs& x) { return ops::slice(x[0], 1, 1, 5, 2); }},
      {"contiguous_of_transposed",
       [](const Inputs& x) { return ops::contiguous(ops::transpose(x[0], 0, 1)); }},
      {"concat_dim1", [](const Inputs& x) { return ops::concat({x[0], x[1], x[2]}, 1); }},
      {"concat_dim0", [](const Inputs& x) { return ops::concat({x[0], x[1]}, 0); }},
      {"sum_to", [](const Inputs& x) { return ops::sum_to(x[0], {3, 1}); }},
      // ---- elementwise ----
      {"add", [](const Inputs& x) { return ops::add(x[0], x[1]); }},
      {"add_broadcast", [](const Inputs& x) { return ops::add(x[0], x[1]); }},
      {"sub_broadcast", [](const Inputs& x) { return ops::sub(x[0], x[1]); }},
      {"mul", [](const Inputs& x) { return ops::mul(x[0], x[1]); }},
      {"mul_broadcast", [](const Inputs& x) { return ops::mul(x[0], x[1]); }},
      {"mul_transposed_input",
       [](const Inputs& x) { return ops::mul(ops::transpose(x[0], 0, 1), x[1]); }},
      {"div", [](const Inputs& x) { return ops::div(x[0], x[1]); }},
      {"div_broadcast", [](const Inputs& x) { return ops::div(x[0], x[1]); }},
      {"scale", [](const Inputs& x) { return ops::scale(x[0], 0.7f); }},
      {"add_scalar", [](const Inputs& x) { return ops::add_scalar(x[0], -1.3f); }},
      {"neg", [](const Inputs& x) { return ops::neg(x[0]); }},
      {"exp", [](const Inputs& x) { return ops::exp(x[0]); }},
      {"log", [](const Inputs& x) { return ops::log(x[0]); }},
      {"sqrt", [](const Inputs& x) { return ops::sqrt(x[0]); }},
      {"square", [](const Inputs& x) { return ops::square(x[0]); }},
      // ---- reductions ----
      {"sum_all", [](const Inputs& x) { return ops::sum(x[0]); }},
      {"sum_dims_0_2", [](const Inputs& x) { return ops::sum(x[0], {0, 2}); }},
      {"sum_last_keepdim", [](const Inputs& x) { return ops::sum(x[0], {-1}, true); }},
      {"mean_all", [](const Inputs& x) { return ops::mean(x[0]); }},
      {"mean_dim1", [](const Inputs& x) { return ops::mean(x[0], {1}); }},
      {"mean_dims_0_2_keepdim", [](const Inputs& x) { return ops::mean(x[0], {0, 2}, true); }},
      // ---- matmul / linear ----
      {"matmul", [](const Inputs& x) { return ops::matmul(x[0], x[1]); }},
      {"matmul_transpose_a", [](const Inputs& x) { return ops::matmul(x[0], x[1], true, false); }},
      {"matmul_transpose_b", [](const Inputs& x) { return ops::matmul(x[0], x[1], false, true); }},
      {"matmul_transpose_ab", [](const Inputs& x) { return ops::matmul(x[0], x[1], true, true); }},
      {"matmul_batch_broadcast", [](const Inputs& x) { return ops::matmul(x[0], x[1]); }},
      {"matmul_batch_broadcast_transpose_b",
       [](const Inputs& x) { return ops::matmul(x[0], x[1], false, true); }},
      {"matmul_of_transposed_view",
       [](const Inputs& x) { return ops::matmul(ops::transpose(x[0], 0, 1), x[1]); }},
      {"linear", [](const Inputs& x) { return ops::linear(x[0], x[1], x[2]); }},
      {"linear_no_bias", [](const Inputs& x) { return ops::linear(x[0], x[1]); }},
      // ---- embedding ----
      {"embedding", [](const Inputs& x) { return ops::embedding(x[0], x[1]); }},
      {"embedding_i32", [](const Inputs& x) { return ops::embedding(x[0], x[1]); }},
      // ---- activations ----
      {"silu", [](const Inputs& x) { return ops::silu(x[0]); }},
      {"swiglu", [](const Inputs& x) { return ops::swiglu(x[0], x[1]); }},
      {"softmax", [](const Inputs& x) { return ops::softmax(x[0], -1); }},
      {"softmax_dim1", [](const Inputs& x) { return ops::softmax(x[0], 1); }},
      {"softmax_of_permuted",
       [](const Inputs& x) { return ops::softmax(ops::permute(x[0], {0, 2, 1}), -1); }},
      {"log_softmax", [](const Inputs& x) { return ops::log_softmax(x[0], -1); }},
      {"log_softmax_dim0", [](const Inputs& x) { return ops::log_softmax(x[0], 0); }},
      {"dropout_eval",
       [](const Inputs& x) {
         Generator gen(7);
         return ops::dropout(x[0], 0.5f, /*training=*/false, gen);
       }},
      {"dropout_p0",
       [](const Inputs& x) {
         Generator gen(7);
         return ops::dropout(x[0], 0.0f, /*training=*/true, gen);
       }},
      // ---- normalisation ----
      {"rms_norm", [](const Inputs& x) { return ops::rms_norm(x[0], x[1], 1e-6f); }},
      {"rms_norm_of_slice",
       [](const Inputs& x) { return ops::rms_norm(ops::slice(x[0], 1, 1, 4), x[1], 1e-5f); }},
      // ---- rotary embedding ----
      {"rope", [](const Inputs& x) { return ops::rope(x[0], 10000.0f, 0); }},
      {"rope_offset", [](const Inputs& x) { return ops::rope(x[0], 10000.0f, 7); }},
      {"rope_theta_1e6", [](const Inputs& x) { return ops::rope(x[0], 1e6f, 3); }},
      // ---- attention ----
      {"attention_gqa_t_lt_s", [](const Inputs& x) { return ops::causal_attention(x[0], x[1], x[2]); }},
      {"attention_gqa_t_eq_s", [](const Inputs& x) { return ops::causal_attention(x[0], x[1], x[2]); }},
      {"attention_mha_scale",
       [](const Inputs& x) { return ops::causal_attention(x[0], x[1], x[2], 0.3f); }},
      {"attention_single_query",
       [](const Inputs& x) { return ops::causal_attention(x[0], x[1], x[2]); }},
      // ---- losses ----
      {"cross_entropy", [](const Inputs& x) { return ops::cross_entropy(x[0], x[1], -100); }},
      {"cross_entropy_ignore_0_i32", [](const Inputs& x) { return ops::cross_entropy(x[0], x[1], 0); }},
      {"cross_entropy_no_ignored", [](const Inputs& x) { return ops::cross_entropy(x[0], x[1]); }},
  };
  return cases;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const OpCase& c : op_cases()) names.push_back(c.name);
  return names;
}

const Fixture& op_fixture() { return load_fixture("torch_ops.py", "ops.json"); }

const json* find_case(const json& fixture, const std::string& name) {
  for (const json& c : fixture.at("cases"))
    if (c.at("name") == name) return &c;
  return nullptr;
}

class OpOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(OpOracle, MatchesTorch) {
  const Fixture& fx = op_fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  const std::string& name = GetParam();
  const json* c = find_case(*fx.data, name);
  ASSERT_NE(c, nullptr) << "case " << name << " missing from torch_ops.py's fixture";
  const OpCase& op = *std::find_if(op_cases().begin(), op_cases().end(),
                                   [&](const OpCase& o) { return o.name == name; });

  Inputs inputs;
  for (const json& j : c->at("inputs")) {
    Tensor t = tensor_from_json(j);
    if (t.dtype() == DType::F32) t.set_requires_grad(true);
    inputs.push_back(t);
  }
  const Tensor out = op.run(inputs);
  const Tensor want = tensor_from_json(c->at("output"));
  ASSERT_EQ(shape_str(out.shape()), shape_str(want.shape())) << "output shape of " << name;
  const ErrorStats fwd = ErrorStats::between(out.to_float_vector(), want.to_float_vector());

  out.backward(tensor_from_json(c->at("upstream")));
  ErrorStats grad;
  const json& grads = c->at("grads");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (grads[i].is_null()) continue;
    const Tensor ours = inputs[i].grad();
    ASSERT_TRUE(ours.defined()) << name << ": no gradient reached input " << i;
    const Tensor ref = tensor_from_json(grads[i]);
    ASSERT_EQ(shape_str(ours.shape()), shape_str(ref.shape())) << name << ": gradient shape of input " << i;
    const ErrorStats e = ErrorStats::between(ours.to_float_vector(), ref.to_float_vector());
    if (e.max_rel > kGradTol) ADD_FAILURE() << name << ": gradient of input " << i << " max_rel " << e.max_rel;
    grad.merge(e);
  }

  std::printf("ORACLE %s fwd max_abs=%s max_rel=%s grad max_abs=%s max_rel=%s\n", name.c_str(),
              format_error(fwd.max_abs).c_str(), format_error(fwd.max_rel).c_str(),
              format_error(grad.max_abs).c_str(), format_error(grad.max_rel).c_str());
  std::fflush(stdout);
  write_table_row("op_errors.md",
                  "| op case | fwd max_abs | fwd max_rel | grad max_abs | grad max_rel |\n"
                  "|---|---|---|---|---|\n",
                  case_names(), name,
                  "| " + name + " | " + format_error(fwd.max_abs) + " | " + format_error(fwd.max_rel) +
                      " | " + format_error(grad.max_abs) + " | " + format_error(grad.max_rel) + " |");
  EXPECT_LE(fwd.max_rel, kForwardTol) << name << " forward";
  EXPECT_LE(grad.max_rel, kGradTol) << name << " gradients";
}

INSTANTIATE_TEST_SUITE_P(Torch, OpOracle, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The C++ table and the Python script must describe the same cases.
TEST(OpOracleFixture, CasesMatchTheScript) {
  const Fixture& fx = op_fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  std::set<std::string> ours, theirs;
  for (const std::string& n : case_names()) EXPECT_TRUE(ours.insert(n).second) << "duplicate case " << n;
  for (const json& c : fx.data->at("cases")) theirs.insert(c.at("name").get<std::string>());
  for (const std::string& n : theirs) EXPECT_TRUE(ours.count(n)) << n << " is in torch_ops.py but not in op_cases()";
  for (const std::string& n : ours) EXPECT_TRUE(theirs.count(n)) << n << " is in op_cases() but not in torch_ops.py";
}

}  // namespace
}  // namespace corelm::oracle
