// The model side of a run: turns record text into prompt tokens (template, truncation policy,
// reuse of the template's prefix), and runs batches of prepared documents through the decoder for
// one task, producing each document's output fields. Batches hold documents of one length bucket
// only, and each document is padded by a rule that depends on it alone, so a document's result is
// bitwise the same whatever batch it lands in (the decoder's rows are independent).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/constraint.h"
#include "corelm/model.h"
#include "corelm/pipeline.h"
#include "corelm/tokenizer.h"

namespace corelm::pipeline {

struct PreparedDoc {
  std::vector<TokenId> tokens;  // the whole prompt
  int64_t reuse = 0;            // leading tokens whose KV comes from the template prefix
  bool truncated = false;
  nlohmann::ordered_json result;  // task fields, filled by Engine::run_batch
};

// The document part of each prompt (after its reused prefix, without the last `hold_back`
// tokens), padded to length T.
std::vector<std::vector<TokenId>> padded_doc_parts(const std::vector<PreparedDoc*>& docs, int64_t T, int64_t hold_back);

class Engine {
 public:
  Engine(const model::Decoder& decoder, const Tokenizer& tokenizer, TaskSpec spec, int64_t max_logits_floats);
  ~Engine();

  // Thread-safe (called on the reader thread). Returns an error reason instead of a document
  // when the policy says so (--truncate error).
  std::optional<PreparedDoc> prepare(const std::string& text, std::string& error) const;

  // Length bucket of a prepared document: the padded token count of its own forward.
  int64_t bucket(const PreparedDoc& doc) const;
  // All documents must share one bucket; at most batch_capacity() of them.
  void run_batch(const std::vector<PreparedDoc*>& docs);
  int64_t batch_capacity() const { return batch_; }
  void set_batch(int64_t batch);  // (re)allocates the KV cache
  int64_t context() const { return ctx_; }

 private:
  // on_row_logits empty: the caller needs no logits from this call.
  void forward(const std::vector<std::vector<TokenId>>& ids, model::KVCache& cache, const std::vector<int64_t>& rows,
               const std::function<void(size_t, const float*)>& on_row_logits);
  void ensure_cache(int64_t positions);  // (re)allocates the KV cache for at least `positions`
  void copy_kv(model::KVCache& src, int64_t src_row, int64_t dst_row, int64_t n);
  void start_rows(const std::vector<PreparedDoc*>& docs, const std::vector<int64_t>& rows);
  // Prefills each document into its row and hands over the logits of its last prompt token.
  void prefill_last(const std::vector<PreparedDoc*>& docs, const std::vector<int64_t>& rows,
                    const std::function<void(size_t, const float*)>& on_last_logits);
  int64_t hold_back() const { return spec_.kind == TaskKind::Score || head_ ? 0 : 1; }
  void classify(const std::vector<PreparedDoc*>& docs);
  // With a classification head: one forward per document, softmax(score(pooled hidden) / T).
  void classify_head(const std::vector<PreparedDoc*>& docs);
  void extract(const std::vector<PreparedDoc*>& docs);
  void score(const std::vector<PreparedDoc*>& docs);

  const model::Decoder& decoder_;
  const Tokenizer& tok_;
  TaskSpec spec_;
  int64_t max_logits_floats_;
  int64_t ctx_ = 0, vocab_ = 0, tok_vocab_ = 0, batch_ = 0, budget_ = 0;
  std::string prefix_text_, suffix_text_;
  std::vector<TokenId> prefix_;
  std::unique_ptr<model::KVCache> prefix_cache_, cache_;
  std::vector<float> prefix_logits_;  // [|prefix|, V]
  std::vector<std::vector<TokenId>> label_tokens_;
  int64_t label_len_ = 0;  // longest label continuation
  std::shared_ptr<const infer::Grammar> grammar_;  // --regex / --choices (infer's constraint engine)
  // Each output's constraint is a clone of this one, so all documents share one mask cache.
  std::optional<infer::TokenConstraint> constraint_;
  // Classification head (ModelConfig::labels): spec label k is head class head_index_[k].
  bool head_ = false;
  std::vector<int64_t> head_index_;
  std::vector<float> prefix_hidden_;  // [|prefix|, H]: mean pooling over reused prefix positions
};

// Fills what a model with a classification head says and the task leaves open: --labels (the
// head's) and --template (the one it was trained with, else "{text}"). Reads only the model
// directory's config.json; a model without a head, or a path that is not a directory, is left
// alone. Called by the runner (and so by eval-task) before the task is validated and hashed.
void apply_model_task_defaults(TaskSpec& task, const std::string& model_path);
// The head's class index of each task label; ValueError naming both sets when a task label is not
// one of the head's (a subset in any order is allowed: probs are renormalised over it).
std::vector<int64_t> head_label_index(const std::vector<std::string>& task_labels,
                                      const std::vector<std::string>& head_labels);

}  // namespace corelm::pipeline
