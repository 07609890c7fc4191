// The execution core shared by every path that turns an OpenAI-shaped body into a response:
// the HTTP handlers (non-streamed), the queue worker (batch lines and /v1/generate), and the
// offline `corelm run batch`. A LoadedModel is a checkpoint with its chat template, stop ids and
// its own infer::Scheduler; execute() parses and validates the body (request.h), applies the
// chat template, tokenizes, checks the context, submits to the scheduler and calls `done` once
// with the finished response, from the scheduler thread (or at once, on the calling thread, for
// an error found before submission). No HTTP and no queue here. Streaming stays in server.cc.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/chat_template.h"
#include "corelm/model.h"
#include "corelm/model_loader.h"
#include "corelm/scheduler.h"
#include "corelm/serve.h"
#include "corelm/tokenizer.h"
#include "request.h"

namespace corelm::serve {

class Metrics;  // metrics.h

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
  Metrics* metrics = nullptr;  // when set: prompt/generated token counts, TTFT and inter-token latency
};

// `model_ids`: the ids the caller serves (parse_request resolves and checks "model" against
// them); `model` must be the one the body names. A body asking for "stream": true is refused
// with a 400 here (streaming is the HTTP handler's). Returns the scheduler request ids (for
// cancel), empty when `done` was already called with an error.
std::vector<infer::RequestId> execute(LoadedModel& model, Endpoint endpoint, std::string_view body,
                                      const std::vector<std::string>& model_ids, const ExecOptions& options,
                                      std::function<void(ExecResult)> done);

// POST /v1/score: the log-likelihood of each input under the model, synchronously on the calling
// thread (its own KV cache; the decoder is shared read-only with the scheduler). Position t
// predicts token t + 1, as `corelm run score`: per input {index, object "score", logprob (the
// sum), tokens (scored), mean_logprob, perplexity}; 400 naming input[i] for a text of fewer than
// two tokens or one longer than the context.
ExecResult score(const LoadedModel& model, const ScoreRequest& request);

// The model id named by a body ("" when absent or not a string): lets a worker pick the model
// before it calls execute().
std::string model_of(std::string_view body);

// ---------------------------------------------------------------------------------------------
// The pieces execute() is made of, shared with the HTTP handler's streamed path (server.cc) so
// that both prepare and submit a request the same way.

// One generated token (or the end of a choice) as the observers see it.
struct TokenEvent {
  int choice = 0;
  bool finished = false;
  TokenId token = 0;
  std::string text, finish_reason;
  bool has_logprob = false;
  infer::TokenLogprob logprob;
  std::vector<infer::TokenLogprob> top;
};

struct ChoiceResult {
  std::string text, finish_reason;
  int64_t completion_tokens = 0;
  bool done = false;
  std::vector<TokenEvent> logprobs;  // per token, when requested
};

// One request's generation state, shared by the observers of its prompts and its consumer (a
// stream writer polling `events`, or `on_complete`).
struct RequestState {
  std::mutex m;
  std::condition_variable cv;
  bool stream = false, want_logprobs = false;
  int n = 1;
  int finished = 0, total = 0;
  std::string error;               // a failed request (on_error)
  std::deque<TokenEvent> events;   // stream: waiting to be written
  std::vector<ChoiceResult> choices;
  std::vector<std::chrono::steady_clock::time_point> last_token;
  std::vector<bool> got_token;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  Metrics* metrics = nullptr;
  std::vector<infer::RequestId> ids;  // scheduler requests, for cancel (under m)
  // Called once, outside `m`, on the scheduler thread, when all_done() first holds.
  std::function<void(RequestState&)> on_complete;
  bool completed = false;
  bool all_done() const { return finished >= total || !error.empty(); }
};

// A parsed request with its prompts tokenized and checked against the model.
struct PreparedRequest {
  ParsedRequest r;
  std::vector<std::vector<TokenId>> prompts;
  std::shared_ptr<const infer::Grammar> grammar;
  int64_t prompt_tokens = 0;
};

// Chat template, tokenization, context / vocabulary / grammar checks: a 400 naming the param.
std::variant<PreparedRequest, ApiError> prepare_request(const LoadedModel& model, ParsedRequest r);
// A fresh state for `p` (stream: events are queued for a writer).
std::shared_ptr<RequestState> make_request_state(const PreparedRequest& p, bool stream, Metrics* metrics);
// Submits every prompt of `p` (prompt i samples from seed + i * n). On a scheduler refusal the
// prompts already submitted are cancelled and the error is returned (429 queue full, 503
// draining, 400, 500).
std::optional<ApiError> submit_prepared(LoadedModel& model, const PreparedRequest& p, uint64_t seed, int priority,
                                        int64_t max_tokens_limit, const std::shared_ptr<RequestState>& st);
// execute() for a body already parsed (the HTTP handler parses once to pick the model).
std::vector<infer::RequestId> execute_parsed(LoadedModel& model, ParsedRequest r, const ExecOptions& options,
                                             std::function<void(ExecResult)> done);

nlohmann::json logprobs_json(const ParsedRequest& r, const Tokenizer& tok, const std::vector<TokenEvent>& events);
std::string finish_for_api(const std::string& finish_reason);
std::string random_hex(size_t n);
uint64_t random_seed();

}  // namespace corelm::serve
