// Continuous batching: one Scheduler per loaded model runs a loop on its own thread. Requests
// join and leave the running batch at every decode step; prefill of new requests is interleaved
// with decode under a per-step token budget, in fixed chunks (chunked prefill); each sequence owns
// a KV slot that is recycled when it ends; a prefix cache keeps the KV of recent prompts in
// chunk-sized blocks so a shared system prompt is computed once; n > 1 copies the prompt's KV to
// the other sequences' slots. A request's tokens are bitwise identical to running it alone: chunk
// boundaries depend only on the request's own tokens, every sequence has its own sampler and
// RNG, and a row of Decoder::forward_cached never depends on the other rows.
// The server (src/serve) only drives it; the persistent queue and fine-tuning jobs of later
// issues submit through the same interface. See docs/SCHEDULER.md.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "corelm/constraint.h"
#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/model.h"
#include "corelm/tokenizer.h"

namespace corelm::infer {

// submit() when the queue is full (the server answers 429 with Retry-After).
class QueueFullError : public Error {
 public:
  using Error::Error;
};
// submit() while draining or stopped (the server answers 503).
class DrainingError : public Error {
 public:
  using Error::Error;
};

struct SchedulerOptions {
  int64_t slots = 8;              // sequences decoded at once (KV cache rows)
  int64_t context = 0;            // positions per slot; 0: the model's max_position_embeddings (capped at 4096)
  int64_t max_queue = 256;        // requests waiting for a slot; beyond it submit() throws QueueFullError
  int64_t step_token_budget = 512;  // tokens per forward step: decode rows (1 each) + prefill chunks
  int64_t prefill_chunk = 128;    // prefill runs in chunks starting at multiples of this (and the prefix-cache block size)
  int64_t prefix_cache_blocks = 256;  // blocks of prefill_chunk tokens kept for reuse (LRU); 0: off
  void validate() const;          // ValueError naming the option
};

// One request: n sequences from one prompt (already templated and encoded).
struct SequenceRequest {
  std::vector<TokenId> prompt;    // non-empty; at most context - 1 tokens (ValueError otherwise)
  int64_t max_new_tokens = 16;    // capped by the slot's context
  int n = 1;                      // sequence i samples with Generator(seed + i)
  uint64_t seed = 0;
  SamplingOptions sampling;       // temperature, top_p, top_k, min_p, repetition_penalty
  float presence_penalty = 0;     // OpenAI semantics, on generated tokens: logit -= presence * (count > 0) + frequency * count
  float frequency_penalty = 0;
  std::vector<std::pair<TokenId, float>> logit_bias;  // added to the logits before anything else
  std::vector<std::string> stop;  // stop strings: text cut before the first, finish "stop"
  bool stop_at_eos = true;
  std::vector<TokenId> eos_ids;   // more EOS ids (the tokenizer's and config's are always in)
  int top_logprobs = -1;          // -1: no logprobs; 0..20: chosen token's logprob + that many alternatives
  std::shared_ptr<const Grammar> grammar;  // null: unconstrained
  // Admission order: a waiting request of higher priority takes the next free slot first (FIFO
  // within one priority). The server submits interactive HTTP requests at kInteractive and work
  // pulled from the persistent queue at kQueued, so batch work never delays an interactive one
  // by more than the sequences already running.
  int priority = 0;
  static constexpr int kInteractive = 1, kQueued = 0;
};

struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0;  // log-softmax of the model's logits (after logit_bias, before penalties/temperature/top-p)
};

// Callbacks run on the scheduler thread: keep them short (push to a queue and return).
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  // Prefill done, first token about to be sampled (time to first token).
  virtual void on_prefilled(int64_t prompt_tokens, int64_t cached_prompt_tokens) {}
  // One generated token of sequence `index`; `text` is the newly final text (may be empty while a
  // UTF-8 character or a possible stop string is held back). `logprob`/`top` only when requested.
  virtual void on_token(int index, TokenId token, const std::string& text, const TokenLogprob* logprob,
                        const std::vector<TokenLogprob>* top) {}
  // Sequence `index` ended: finish_reason "stop" | "length" | "cancelled" | "error"; `text` is the
  // whole generated text (the concatenation of on_token texts); completion_tokens counts tokens
  // generated (a final EOS included).
  virtual void on_finished(int index, const std::string& finish_reason, const std::string& text,
                           int64_t completion_tokens) {}
  // The request failed as a whole (e.g. out of memory); no more callbacks follow.
  virtual void on_error(const std::string& message) {}
};

using RequestId = uint64_t;

struct SlotInfo {
  int64_t slot = 0;
  std::string state;       // "idle", "prefill", "decode"
  RequestId request = 0;   // 0 when idle
  int index = 0;           // which of the request's n sequences
  int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0, kv_tokens = 0;
};

struct SchedulerStats {
  int64_t queued = 0, running = 0;          // requests waiting / with at least one slot
  int64_t slots = 0, slots_busy = 0;
  int64_t kv_tokens_used = 0, kv_tokens_capacity = 0;  // positions held in slots
  int64_t prefix_cache_blocks = 0;          // blocks held now
  uint64_t prefix_cache_hit_tokens = 0;     // prompt tokens not recomputed, since start
  uint64_t prompt_tokens = 0, generated_tokens = 0, requests_finished = 0, requests_cancelled = 0;
  uint64_t steps = 0;
};

class Scheduler {
 public:
  // The model and tokenizer must outlive the scheduler. Starts the loop thread.
  Scheduler(const model::Decoder& decoder, const Tokenizer& tokenizer, SchedulerOptions options);
  ~Scheduler();  // cancels everything and joins
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; callbacks follow on the scheduler thread. ValueError for a bad request
  // (empty or too long prompt, n < 1, top_logprobs > 20, ...), QueueFullError, DrainingError.
  RequestId submit(SequenceRequest request, std::shared_ptr<RequestObserver> observer);
  // Stops a request (queued or running) soon: its unfinished sequences end with "cancelled" and
  // its slots are freed. The prompt's prefix-cache blocks already computed are kept. Unknown or
  // finished ids are ignored.
  void cancel(RequestId id);

  // Stops admitting (submit -> DrainingError), waits until every request has finished or the
  // deadline passes, then cancels what is left. Returns true when nothing had to be cancelled.
  bool drain(std::chrono::steady_clock::time_point deadline);

  SchedulerStats stats() const;
  std::vector<SlotInfo> slots() const;
  const SchedulerOptions& options() const;
  int64_t context() const;  // positions per slot

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace corelm::infer
