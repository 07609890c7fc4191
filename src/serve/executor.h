// The execution core shared by every path that turns an OpenAI-shaped body into a response:
// the HTTP handlers (non-streamed), the queue worker (batch lines and /v1/generate), and the
// offline `corelm run batch`. A LoadedModel is a checkpoint with its chat template, stop ids and
// its own infer::Scheduler; execute() parses and validates the body (request.h), applies the
// chat template, tokenizes, checks the context, submits to the scheduler and calls `done` once
// with the finished response, from the scheduler thread (or at once, on the calling thread, for
// an error found before submission). No HTTP and no queue here. Streaming stays in server.cc.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/chat_template.h"
#include "corelm/model.h"
#include "corelm/scheduler.h"
#include "corelm/serve.h"
#include "request.h"

namespace corelm::serve {

struct LoadedModel {
  explicit LoadedModel(model::Checkpoint c) : ckpt(std::move(c)) {}
  model::Checkpoint ckpt;
  std::unique_ptr<infer::ChatTemplate> chat_template;
  std::string chat_template_error;
  std::vector<TokenId> eos_ids;       // every EOS id (checkpoint + tokenizer)
  std::vector<TokenId> chat_stop_ids; // end-of-turn tokens the chat template emits
  std::unique_ptr<infer::Scheduler> scheduler;  // declared last: destroyed before the model
  ~LoadedModel() { scheduler.reset(); }
};

// Loads `path` (any format load_model reads), prepares it at o.precision and starts its
// scheduler with o.slots / o.ctx / o.max_queue. ValueError when the model has no tokenizer.
std::shared_ptr<LoadedModel> load_model_for_serving(const std::string& path, const ServeOptions& o);

// The finished response: status 200 and the OpenAI completion / chat.completion object, or an
// error status and ApiError::to_json().
struct ExecResult {
  int status = 200;
  nlohmann::json body;
};

struct ExecOptions {
  RequestLimits limits;
  int64_t max_tokens_limit = 4096;
  // A request without "seed" samples with this one when set (the queue passes a seed derived from
  // the request's content hash, so a redone request reproduces its first run); else a random one.
  std::optional<uint64_t> default_seed;
  int priority = infer::SequenceRequest::kInteractive;
  // Response "id" and "created": generated when empty / 0 (the queue passes stable ones).
  std::string response_id;
  int64_t created = 0;
};

// `model_ids`: the ids the caller serves (parse_request resolves and checks "model" against
// them); `model` must be the one the body names. A body asking for "stream": true is refused
// with a 400 here (streaming is the HTTP handler's). Returns the scheduler request ids (for
// cancel), empty when `done` was already called with an error.
std::vector<infer::RequestId> execute(LoadedModel& model, Endpoint endpoint, std::string_view body,
                                      const std::vector<std::string>& model_ids, const ExecOptions& options,
                                      std::function<void(ExecResult)> done);

// The model id named by a body ("" when absent or not a string): lets a worker pick the model
// before it calls execute().
std::string model_of(std::string_view body);

}  // namespace corelm::serve
