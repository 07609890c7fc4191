// The atomic writer lives in core (include/corelm/durable.h) so that every component, tokenizer
// included, writes files the same way; io keeps its historical spelling.
#pragma once
#include "corelm/durable.h"

namespace corelm::io {
using corelm::AtomicWriter;
}  // namespace corelm::io
