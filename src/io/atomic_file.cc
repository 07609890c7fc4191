// io's spelling of the atomic file write; the mechanism is core's (include/corelm/durable.h).
#include "corelm/durable.h"
#include "corelm/safetensors.h"

namespace corelm::io {

void write_file_atomic(const std::string& path, const std::string& bytes) { corelm::write_file_atomic(path, bytes); }

}  // namespace corelm::io
