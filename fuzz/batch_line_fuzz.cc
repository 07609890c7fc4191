// Fuzz target: arbitrary bytes as one line of a batch input file. The validator must return a
// queue row or a line error (never throw, crash or hang); a row it returns must be what the
// Batches API promises to enqueue: a non-empty custom_id, one of the two endpoints (the batch's
// when it has one), a served model, and a compact JSON body that the request parser accepts
// again (the worker parses it a second time).
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "serve/batch_api.h"

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace corelm::serve;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> models{"m", "other"};
  RequestLimits limits;
  limits.max_n = 4;
  limits.max_tokens_limit = 64;
  for (const std::string endpoint : {"/v1/completions", "/v1/chat/completions", ""}) {
    auto r = parse_batch_line(line, 3, endpoint, models, limits);
    if (auto* e = std::get_if<BatchLineError>(&r)) {
      check(!e->code.empty() && !e->message.empty());
      check(e->line == 3);
      continue;
    }
    const corelm::queue::NewRequest& n = std::get<corelm::queue::NewRequest>(r);
    check(n.custom_id && !n.custom_id->empty());
    check(!n.batch_id);
    check(n.endpoint == "/v1/completions" || n.endpoint == "/v1/chat/completions");
    check(endpoint.empty() || n.endpoint == endpoint);
    check(n.model == "m" || n.model == "other");
    auto body = nlohmann::json::parse(n.body, nullptr, false);
    check(!body.is_discarded() && body.is_object());
    Endpoint ep = n.endpoint == "/v1/completions" ? Endpoint::Completions : Endpoint::ChatCompletions;
    ParseResult again = parse_request(ep, n.body, limits, models);
    check(std::holds_alternative<ParsedRequest>(again));
    check(std::get<ParsedRequest>(again).model == n.model);
  }
  return 0;
}
