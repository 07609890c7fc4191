// Grammar::json_object: any JSON object, as a character-level pushdown recogniser.
#include "corelm/error.h"
#include "infer/constraint_impl.h"

namespace corelm::infer {

std::shared_ptr<const Grammar> Grammar::json_object() {
  throw ValueError("json_object: not implemented yet");
}

}  // namespace corelm::infer
