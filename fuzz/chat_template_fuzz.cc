// Fuzz target: arbitrary bytes as a chat template, parsed and rendered over a fixed conversation.
// Parsing and rendering must either succeed or throw TemplateError -- never crash, hang or grow
// without bound: the renderer's limits (src/infer/jinja_ast.h Limits: nesting 64, expression
// height 256, 2M evaluation steps, 16 MiB of output, 1M list items) bound every input.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "corelm/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9 {{x}}"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                 {"role": "user", "content": "  again\n"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": 3, "f": 2.5})");
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const corelm::infer::ChatTemplate t(source);
    const std::string out = t.render(context);
    if (out.size() > (16u << 20)) std::abort();  // the documented output bound
  } catch (const corelm::infer::TemplateError&) {
  }
  return 0;
}
