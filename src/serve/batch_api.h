// The OpenAI Files and Batches API over the persistent queue: /v1/files (multipart upload with
// purpose=batch, metadata, content, delete, list) and /v1/batches (create, retrieve, list,
// cancel). Creating a batch validates the input file line by line ({custom_id, method, url,
// body}; errors.data[{code, line, message, param}]) and enqueues one queue row per line in one
// transaction; the queue workers of every server sharing the state dir run them; a monitor
// thread moves batches validating -> in_progress -> finalizing -> completed (or failed,
// cancelling -> cancelled, expired) and the output / error files are rendered from the results
// table when read (nothing is copied). See docs/SERVING.md, "Files and Batches API".
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "corelm/queue.h"
#include "request.h"

namespace httplib {
class Server;
}

namespace corelm::serve {

// One invalid input line, as OpenAI reports it in a batch's errors.data[].
struct BatchLineError {
  std::string code;     // "invalid_json", "missing_custom_id", "duplicate_custom_id", "invalid_url", "model_not_found", ...
  int64_t line = 0;     // 1-based
  std::string message;
  std::string param;    // "" -> null
};

// Validates one line of a batch input file ({custom_id, method, url, body}) and turns it into a
// queue row (model, body text, endpoint, custom_id; batch_id left empty). `endpoint`: the
// batch's endpoint (the line's url must equal it); "" accepts either completions endpoint (the
// offline `corelm run batch`). Duplicate custom_ids are the caller's check (it sees every line).
// Shared by the Batches API and `corelm run batch`, fuzzed by fuzz/batch_line_fuzz.cc.
std::variant<queue::NewRequest, BatchLineError> parse_batch_line(std::string_view line, int64_t line_no,
                                                                 const std::string& endpoint,
                                                                 const std::vector<std::string>& model_ids,
                                                                 const RequestLimits& limits);

struct BatchApiContext {
  queue::Queue* queue = nullptr;                         // shared, thread-safe; outlives the BatchApi
  std::function<std::vector<std::string>()> model_ids;   // the ids this server serves
  RequestLimits limits;                                  // each line's body is checked with parse_request
  int64_t max_file_bytes = 200 << 20;
  // Requests per batch (OpenAI's limit too). A batch is enqueued in one transaction that holds
  // the queue's write lock (~10-70 µs a row here), so this bounds how long other writers wait.
  int64_t max_batch_requests = 50'000;
  double monitor_interval_s = 0.2;                       // how often the monitor thread looks at batches
};

class BatchApi {
 public:
  explicit BatchApi(BatchApiContext ctx);
  ~BatchApi();  // stops the monitor
  BatchApi(const BatchApi&) = delete;
  BatchApi& operator=(const BatchApi&) = delete;
  void register_routes(httplib::Server& http);
  void start();  // the monitor thread
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace corelm::serve
