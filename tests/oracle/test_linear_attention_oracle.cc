// ops::linear_attention against the naive per-token recurrence in PyTorch with autograd
// (tests/oracle/torch_linear_attention.py): output, final state and the gradients of q, k, v
// and log_decay, on every ISA path this machine has (reference = per-token recurrence, the
// others = the chunked form). Errors as in test_op_oracle.cc (max_rel = max_abs / max|torch|),
// printed as `ORACLE linear_attention ...` lines and collected in
// CORELM_BINARY_DIR/oracle/linear_attention_errors.md. Bounds: forward 1e-5, gradients 1e-4.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "corelm/isa.h"
#include "corelm/ops.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

Tensor optional_tensor(const json& j) { return j.is_null() ? Tensor() : tensor_from_json(j); }

TEST(LinearAttentionOracle, MatchesTorchRecurrence) {
  const Fixture& fx = load_fixture("torch_linear_attention.py", "linear_attention.json");
  CORELM_REQUIRE_FIXTURE(fx);
  std::vector<std::string> rows;
  for (const json& c : fx.data->at("cases"))
    for (Isa isa : supported_isas()) rows.push_back(c.at("name").get<std::string>() + " (" + isa_name(isa) + ")");
  const char* grad_names[] = {"q", "k", "v", "log_decay"};
  for (const json& c : fx.data->at("cases")) {
    const std::string name = c.at("name");
    for (Isa isa : supported_isas()) {
      ScopedIsa scope(isa);
      const std::string row = name + " (" + isa_name(isa) + ")";
      SCOPED_TRACE(row);
      std::vector<Tensor> in;
      for (const json& j : c.at("inputs")) {
        in.push_back(tensor_from_json(j));
        in.back().set_requires_grad(true);
      }
      Tensor final_state;
      const Tensor out = ops::linear_attention(in[0], in[1], in[2], in[3], optional_tensor(c.at("doc_ids")),
                                               optional_tensor(c.at("initial_state")), &final_state,
                                               c.at("scale").get<float>());
      const ErrorStats fwd = ErrorStats::between(out.to_float_vector(), tensor_from_json(c.at("output")).to_float_vector());
      const ErrorStats state =
          ErrorStats::between(final_state.to_float_vector(), tensor_from_json(c.at("final_state")).to_float_vector());
      out.backward(tensor_from_json(c.at("upstream")));
      ErrorStats grads[4];
      std::string grad_cols;
      for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(in[i].grad().defined()) << "no gradient for " << grad_names[i];
        grads[i] = ErrorStats::between(in[i].grad().to_float_vector(),
                                       tensor_from_json(c.at("grads")[i]).to_float_vector());
        EXPECT_LE(grads[i].max_rel, 1e-4) << "gradient of " << grad_names[i];
        grad_cols += " | " + format_error(grads[i].max_abs) + " / " + format_error(grads[i].max_rel);
      }
      EXPECT_LE(fwd.max_rel, 1e-5) << "output";
      EXPECT_LE(state.max_rel, 1e-5) << "final state";
      std::printf("ORACLE linear_attention %s fwd max_abs=%s max_rel=%s state max_rel=%s grad max_rel q=%s k=%s v=%s "
                  "log_decay=%s\n",
                  row.c_str(), format_error(fwd.max_abs).c_str(), format_error(fwd.max_rel).c_str(),
                  format_error(state.max_rel).c_str(), format_error(grads[0].max_rel).c_str(),
                  format_error(grads[1].max_rel).c_str(), format_error(grads[2].max_rel).c_str(),
                  format_error(grads[3].max_rel).c_str());
      std::fflush(stdout);
      write_table_row("linear_attention_errors.md",
                      "| case / path | output max_abs / max_rel | final state max_rel | dq | dk | dv | dlog_decay |\n"
                      "|---|---|---|---|---|---|---|\n",
                      rows, row,
                      "| " + row + " | " + format_error(fwd.max_abs) + " / " + format_error(fwd.max_rel) + " | " +
                          format_error(state.max_rel) + grad_cols + " |");
    }
  }
}

}  // namespace
}  // namespace corelm::oracle
