// Shared machinery of the PyTorch oracle tests: run a fixture script with a Python that has
// torch, load its JSON, turn JSON tensors into corelm tensors, measure errors and keep a
// markdown table of them under CORELM_BINARY_DIR/oracle/.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "corelm/tensor.h"

namespace corelm::oracle {

using nlohmann::json;

// Result of producing a fixture: the parsed JSON, or why not. `skip` is set when no Python with
// torch exists (the test should GTEST_SKIP with `message`); otherwise a missing fixture is a failure.
struct Fixture {
  std::optional<json> data;
  bool skip = false;
  std::string message;
};

// Runs tests/oracle/<script> (with CORELM_TEST_PYTHON, falling back to /usr/bin/python3) into
// CORELM_BINARY_DIR/oracle/<output_name> unless that file is newer than the scripts, then parses it.
// Cached per process, so each test executable runs the script at most once.
const Fixture& load_fixture(const std::string& script, const std::string& output_name);

// In a test body: skip when there is no torch, fail when the fixture could not be produced.
#define CORELM_REQUIRE_FIXTURE(fx)                    \
  do {                                                \
    if ((fx).skip) GTEST_SKIP() << (fx).message;      \
    ASSERT_TRUE((fx).data.has_value()) << (fx).message; \
  } while (0)

// {"dtype": "f32"|"i32"|"i64", "shape": [...], "data": [...]} -> a fresh contiguous tensor.
Tensor tensor_from_json(const json& j);
Shape shape_from_json(const json& j);

// Error of `ours` against the reference `ref`, both flattened in row-major order:
//   max_abs = max_i |ours_i - ref_i|,  max_rel = max_abs / max_i |ref_i|
// (relative to the largest reference magnitude, so elements near zero do not blow it up; when the
// reference is all zeros, max_rel = max_abs). merge() keeps the worst of several tensors.
struct ErrorStats {
  double max_abs = 0.0;
  double max_rel = 0.0;
  static ErrorStats between(const std::vector<float>& ours, const std::vector<float>& ref);
  void merge(const ErrorStats& other);
};

std::string format_error(double v);  // "1.234e-07"

// Records `row` (a markdown table row without the trailing newline) for `name` and rewrites
// CORELM_BINARY_DIR/oracle/<table_file>: `header` then the rows of `names` that exist, in that
// order. Rows live one per file so tests in separate processes (ctest) all end up in the table.
void write_table_row(const std::string& table_file, const std::string& header,
                     const std::vector<std::string>& names, const std::string& name,
                     const std::string& row);

}  // namespace corelm::oracle
