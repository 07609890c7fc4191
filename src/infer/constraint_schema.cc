// The JSON Schema subset compiled to a regular expression.
#include "corelm/error.h"
#include "infer/constraint_impl.h"

namespace corelm::infer::constraint {

std::string schema_to_regex(const nlohmann::json& schema) {
  throw ValueError("json_schema: not implemented yet");
}

}  // namespace corelm::infer::constraint
