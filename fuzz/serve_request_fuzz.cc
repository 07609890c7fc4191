// Fuzz target: arbitrary bytes as the body of every POST endpoint. The request parser must
// return a request or an ApiError (never throw, crash or hang), and what it accepts must hold
// the limits it promises (n, max_tokens, stop count, valid UTF-8 strings).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "corelm/utf8.h"
#include "serve/request.h"

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace corelm::serve;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> models{"m", "other"};
  RequestLimits limits;
  limits.max_n = 4;
  limits.max_tokens_limit = 64;
  for (Endpoint e : {Endpoint::Completions, Endpoint::ChatCompletions}) {
    ParseResult r = parse_request(e, body, limits, {"m"});
    if (auto* err = std::get_if<ApiError>(&r)) {
      check(err->status == 400 || err->status == 404);
      check(!err->message.empty());
      (void)err->to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      continue;
    }
    const ParsedRequest& p = std::get<ParsedRequest>(r);
    check(p.model == "m");
    check(p.n >= 1 && p.n <= limits.max_n);
    check(!p.max_tokens || (*p.max_tokens >= 1 && *p.max_tokens <= limits.max_tokens_limit));
    check(static_cast<int>(p.stop.size()) <= limits.max_stop);
    for (const auto& s : p.stop) check(!s.empty() && corelm::valid_utf8(s));
    for (const auto& pr : p.prompts) check(pr.is_ids || corelm::valid_utf8(pr.text));
    for (const auto& m : p.messages) check(corelm::valid_utf8(m.role) && corelm::valid_utf8(m.content));
    check(p.top_logprobs >= -1 && p.top_logprobs <= 20);
    check(e == Endpoint::Completions ? !p.prompts.empty() : !p.messages.empty());
  }
  (void)parse_tokenize(body, models);
  (void)parse_detokenize(body, models);
  // /v1/score: a parsed body names a served model and 1..max_prompts valid UTF-8 texts.
  auto sc = parse_score(body, limits, models);
  if (auto* s = std::get_if<ScoreRequest>(&sc)) {
    check(s->model == "m" || s->model == "other");
    check(!s->inputs.empty() && static_cast<int>(s->inputs.size()) <= limits.max_prompts);
    for (const auto& t : s->inputs) check(corelm::valid_utf8(t));
  } else {
    check(std::get<ApiError>(sc).status == 400 || std::get<ApiError>(sc).status == 404);
  }
  return 0;
}
