// Training a Decoder on one machine: token data and window samplers (pretraining and SFT pairs),
// learning-rate schedules, the training loop (AdamW, clipping, accumulation, JSONL log, progress
// line, validation + sample generations) and checkpoints that resume bit-identically.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/random.h"
#include "corelm/tensor.h"
#include "corelm/tokenizer.h"

namespace corelm::dist {
class World;  // corelm/mpi.h
}

namespace corelm::train {

// ---- learning-rate schedules (src/train/schedule.cc) ----

enum class ScheduleKind { kConstant, kCosine, kWsd };
ScheduleKind parse_schedule(const std::string& name);  // "constant" | "cosine" | "wsd"; ValueError
std::string schedule_name(ScheduleKind kind);

struct Schedule {
  ScheduleKind kind = ScheduleKind::kCosine;
  double lr = 1e-3;             // peak
  int64_t warmup = 0;           // linear warmup steps: lr * (step + 1) / warmup
  int64_t total = 1;            // steps of the run
  double min_lr_ratio = 0.1;    // cosine/wsd decay to lr * min_lr_ratio
  double decay_fraction = 0.2;  // wsd: the last fraction of steps decays linearly
  // Learning rate for the 0-based optimizer step `step`.
  double at(int64_t step) const;
};

// ---- data (src/train/data.cc, src/train/sft.cc) ----

// A flat sequence of token ids: a memory-mapped token file from `corelm tokenize` (uint16/uint32
// plus its "<file>.json" sidecar) or ids held in memory.
class TokenDataset {
 public:
  static TokenDataset open(const std::string& token_file);  // IOError/FormatError naming the file
  static TokenDataset from_ids(std::vector<TokenId> ids);
  // Each text file is encoded in full (with `threads` threads) and the ids concatenated.
  static TokenDataset from_text_files(const Tokenizer& tokenizer, const std::vector<std::string>& files,
                                      int threads = 1);

  int64_t size() const { return size_; }
  TokenId operator[](int64_t i) const;
  int64_t vocab_bound() const;  // 1 + the largest id (scans once; cached)

 private:
  std::shared_ptr<const void> keep_;  // mmap or vector owner
  const void* data_ = nullptr;
  int dtype_bytes_ = 4;
  int64_t size_ = 0;
  mutable int64_t vocab_bound_ = -1;
};

// One training/validation batch: ids [B, T] i64 and targets [B, T] i64 (-100 = no loss).
struct Batch {
  Tensor ids, targets;
  Tensor lengths = Tensor();  // classification batches only: real tokens per row [B] i64 (targets: labels [B])
  Tensor soft_targets = Tensor();  // classification with a teacher only: its probabilities [B, L] f32
  int64_t tokens() const { return ids.defined() ? ids.numel() : 0; }
};

// A seeded source of batches whose whole position is in state() (for exact resume).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next(int64_t batch, int64_t seq) = 0;
  virtual Generator::State state() const = 0;
  virtual void set_state(const Generator::State& state) = 0;
  virtual int64_t drawn() const = 0;  // rows drawn so far (the "data position")
  virtual void set_drawn(int64_t rows) = 0;
};

// Pretraining: random contiguous windows of seq + 1 tokens within [begin, end) of a dataset.
class WindowSampler : public BatchSource {
 public:
  WindowSampler(const TokenDataset& data, int64_t begin, int64_t end, uint64_t seed);
  Batch next(int64_t batch, int64_t seq) override;
  Generator::State state() const override { return gen_.state(); }
  void set_state(const Generator::State& s) override { gen_.set_state(s); }
  int64_t drawn() const override { return drawn_; }
  void set_drawn(int64_t rows) override { drawn_ = rows; }

 private:
  const TokenDataset& data_;
  int64_t begin_, end_;
  Generator gen_;
  int64_t drawn_ = 0;
};

// The validation split: the last `fraction` of the tokens (at least one window of seq + 1).
struct Split {
  int64_t train_end = 0;  // train = [0, train_end), validation = [train_end, size)
};
Split split_tokens(int64_t size, double val_fraction, int64_t seq);
// ValueError naming --val-fraction unless it is in [0, 1) (0: no validation split).
void check_val_fraction(double val_fraction);

// Non-overlapping windows of seq + 1 tokens with stride seq over [begin, end), batched: every
// token after `begin` is a target exactly once (the last window may be shorter; its row is
// padded with ignored targets). Used for validation and `corelm eval`.
std::vector<Batch> sequential_batches(const TokenDataset& data, int64_t begin, int64_t end, int64_t batch,
                                      int64_t seq, int64_t max_batches = -1);

// Supervised fine-tuning pairs {"input": ..., "output": ...} (one JSON object per line).
struct SftPair {
  std::vector<TokenId> input, output;
};
// Encodes each pair (output followed by EOS when the tokenizer has one). Malformed lines ->
// FormatError "FILE:LINE: ...". Blank lines are skipped.
std::vector<SftPair> load_sft_pairs(const std::string& path, const Tokenizer& tokenizer);
// How many of `pairs` pairs form the validation tail: 0 when val_fraction is 0 or there are fewer
// than 2 pairs, else at least 1. ValueError naming --val-fraction outside [0, 1).
size_t sft_validation_pairs(size_t pairs, double val_fraction);

// One pair per row (no cross-pair packing: the causal attention op cannot keep attention inside
// a pair), truncated to seq + 1 tokens, padded; targets are -100 on input and padding tokens.
Batch make_sft_batch(const std::vector<const SftPair*>& pairs, int64_t seq, TokenId pad_id);

class SftSampler : public BatchSource {
 public:
  SftSampler(const std::vector<SftPair>& pairs, size_t begin, size_t end, TokenId pad_id, uint64_t seed);
  Batch next(int64_t batch, int64_t seq) override;
  Generator::State state() const override { return gen_.state(); }
  void set_state(const Generator::State& s) override { gen_.set_state(s); }
  int64_t drawn() const override { return drawn_; }
  void set_drawn(int64_t rows) override { drawn_ = rows; }

 private:
  const std::vector<SftPair>& pairs_;
  size_t begin_, end_;
  TokenId pad_;
  Generator gen_;
  int64_t drawn_ = 0;
};

// ---- the loop (src/train/trainer.cc) and checkpoints (src/train/checkpoint.cc) ----

// A training objective other than next-token prediction (the classification head,
// src/train/classify.cc). The trainer keeps its loop, optimizer, checkpoints and log; the
// objective gives each micro-batch's mean loss and replaces the validation pass.
class Objective {
 public:
  virtual ~Objective() = default;
  // Mean loss of one batch, recorded on the graph (its backward accumulates into .grad()).
  virtual Tensor loss(const model::Decoder& model, const Batch& batch) = 0;
  // One evaluation after optimizer step `step`: adds its figures to `fields` (written to the log
  // line) and returns the validation loss (NaN: none).
  virtual double evaluate(const model::Decoder& model, int64_t step,
                          std::vector<std::pair<std::string, double>>& fields) = 0;
  // Called once by train() before the first step: `resumed_step` is the checkpoint's step on
  // --resume, -1 for a fresh start; eval_every and steps are the run's schedule (an evaluation at
  // another step is an interruption's). An objective that keeps state across evaluations
  // persists it under out_dir and reloads it here, so a resumed run ends as an uninterrupted one.
  virtual void on_start(const std::string& out_dir, int64_t resumed_step, int64_t eval_every, int64_t steps) {}
};

struct TrainOptions {
  std::string out_dir;       // checkpoints + train_log.jsonl (layout: save_checkpoint below)
  int64_t steps = 100;       // optimizer steps of the whole run (the schedule's length)
  int64_t stop_at = 0;       // > 0: stop (and checkpoint) after this step, as an interruption would
  double time_budget_s = 0;  // > 0: stop (and checkpoint) once this much wall time has passed
  int64_t batch = 8, seq = 128, grad_accum = 1;
  Schedule schedule;         // total is set to `steps`
  float weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float clip = 1.0f;         // global-norm clipping; 0 disables
  int64_t eval_every = 0;    // validation loss (and a sample) every N steps; 0: only at the end
  int64_t eval_batches = 8;  // validation batches per evaluation (sequential windows); 0: none
  int64_t save_every = 0;    // checkpoint every N steps; always at the end
  int64_t keep_checkpoints = 2;  // step folders kept in out_dir/checkpoints (the newest; >= 1)
  int64_t log_every = 10;    // progress line period when stderr is not a terminal
  int sample_tokens = 32;    // greedy tokens generated after each evaluation (0: none)
  std::string sample_prompt; // empty: the first 8 validation tokens
  uint64_t seed = 0;
  bool resume = false;
  bool progress = true;      // progress line on stderr
  // SIGINT / SIGTERM during train() finish the current step, write a checkpoint and return
  // (TrainResult::stopped_by_signal); a second signal has its default effect, which is safe
  // because a checkpoint is committed as a whole or not at all. Off for library callers that
  // handle signals themselves; the CLI turns it on.
  bool stop_on_signals = false;
  // Training loss (validation always uses the full softmax): "full" (fused LM head +
  // cross-entropy) or "sampled" (softmax over the batch targets plus `sampled_negatives` ids drawn
  // per micro-batch from q ∝ max(count, sampled_floor)^sampled_alpha, with the logQ correction;
  // src/train/sampled_softmax.h). "sampled" needs `unigram_counts` (training-split token counts,
  // one per vocabulary id).
  std::string loss = "full";
  int64_t sampled_negatives = 1024;
  double sampled_floor = 32;
  double sampled_alpha = 1.0;
  std::vector<int64_t> unigram_counts;
  // Matrix-product precision of the training forward/backward ("f32" | "bf16"; corelm/autocast.h).
  std::string compute_dtype = "f32";
  // Not owned; null: next-token prediction with `loss` above.
  Objective* objective = nullptr;
  // Data-parallel training over MPI (src/train/data_parallel.h, docs/SCALE-OUT.md): null, or a
  // world of one rank, trains alone. With N ranks every rank draws the global micro-batch of
  // N x `batch` rows and trains on its `batch` of them; gradients are summed in buckets of
  // `bucket_bytes`, started during backward when `overlap_allreduce`; rank 0 alone writes the
  // checkpoints and the log and runs validation (the CLI turns `progress` off on the others).
  const dist::World* world = nullptr;
  int64_t bucket_bytes = 4 << 20;
  bool overlap_allreduce = true;
  int64_t checksum_every = 100;  // cross-rank parameter checksum every N steps (0: only at the end)

  // ValueError naming the CLI option (--warmup, --clip, --min-lr-ratio, ...) of the first value
  // out of range. train() calls it first, so nothing is written for a bad option.
  void validate() const;
};

// Training stopped because the loss, the gradient norm or the weights became non-finite
// (divergence: a learning rate far too high, no clipping). Nothing is saved at that step; the
// message names the last good checkpoint, which stays the one --resume loads.
class TrainingDiverged : public Error {
  using Error::Error;
};

struct CurvePoint {
  int64_t step = 0;
  double train_loss = 0, val_loss = 0;  // val_loss NaN when not evaluated at that step
};

struct TrainResult {
  int64_t start_step = 0, end_step = 0;
  double last_train_loss = 0;
  std::optional<double> last_val_loss;  // absent when nothing was evaluated (no validation data)
  int stopped_by_signal = 0;            // SIGINT / SIGTERM that ended the run (stop_on_signals)
  bool stopped_by_time_budget = false;  // time_budget_s ran out before steps / stop_at
  std::string checkpoint;               // the checkpoint folder the run committed last
  double tokens_per_s = 0;  // over the steps of this run (excluding evaluation and saving)
  int64_t tokens_seen = 0;
  std::vector<CurvePoint> curve;  // one point per evaluation
};

// Trains `model` in place. `tokenizer_json` (the tokenizer's file) is copied into each
// checkpoint; `tokenizer` (may be null) decodes the sample generations. `val` may be null.
// With options.resume, the checkpoint in out_dir (if any) is loaded first: weights, optimizer
// state, step, sampler state; training then continues exactly as if it had never stopped.
// out_dir is locked for the whole call (lock_output_dir). A non-finite loss, gradient norm or
// weight throws TrainingDiverged without saving.
TrainResult train(model::Decoder& model, BatchSource& data, const std::vector<Batch>* val,
                  const Tokenizer* tokenizer, const std::string& tokenizer_json, const TrainOptions& options);

// Mean loss over batches (no gradient); sums per-token NLL so it is exact over ragged batches.
struct EvalResult {
  double mean_loss = 0;
  int64_t tokens = 0;
};
EvalResult evaluate(const model::Decoder& model, const std::vector<Batch>& batches);

// Greedy continuation of `prompt` (recomputes the whole sequence per token; no KV cache). Only ids
// below `vocab_limit` are chosen when it is > 0: a model whose embedding is larger than its
// tokenizer (a padded or not yet filled vocabulary) must not emit ids the tokenizer cannot decode.
std::vector<TokenId> greedy_generate(const model::Decoder& model, std::vector<TokenId> prompt, int new_tokens,
                                     std::optional<TokenId> eos = std::nullopt, int64_t vocab_limit = 0);

// The trainer's resumable state (trainer_state.json).
struct TrainerState {
  int64_t step = 0;  // optimizer steps done
  int64_t tokens_seen = 0;
  int64_t rows_drawn = 0;
  Generator::State sampler{};
  uint64_t seed = 0;
  std::string schedule;
  double lr = 0;
  // The kernel of the bf16 products ("dpbf16" | "rounded", corelm/autocast.h) when training ran
  // with --compute-dtype bf16; empty otherwise. A resume uses it, so its steps stay bit-identical.
  std::string bf16_gemm;
};

// ---- checkpoints (src/train/checkpoint.cc; docs/TRAINING.md "Checkpoints and --resume") ----
//
// OUT/checkpoints/step-00000120/   one complete checkpoint per save: model.safetensors,
//                                  config.json, tokenizer.json, optimizer.safetensors,
//                                  trainer_state.json; written under a temp name and renamed
//                                  into place whole (StagedDir)
// OUT/checkpoints/latest           "step-00000120": THE commit point, replaced atomically after
//                                  the step folder is complete; --resume loads what it names
// OUT/{config.json, model.safetensors, tokenizer.json}
//                                  hard links to the latest checkpoint's files (updated after the
//                                  pointer), so OUT itself is a model directory for generate,
//                                  eval, convert and --init
// A kill -9 or a full disk at any point leaves `latest` naming a complete checkpoint.

// Writes the checkpoint of state.step into out_dir as above and moves the pointer to it;
// returns its folder. Refuses (TrainingDiverged) weights or moments that are not finite.
// Older step folders are not removed here (prune_checkpoints).
std::string save_checkpoint(const std::string& out_dir, const model::Decoder& model, const std::vector<Tensor>& exp_avg,
                            const std::vector<Tensor>& exp_avg_sq, const TrainerState& state,
                            const std::string& tokenizer_json);
// The committed checkpoint folder of `dir`: what DIR/checkpoints/latest names, else DIR itself
// when it holds trainer_state.json (a step folder, or an output folder of the older layout with
// the files at its top level); "" when there is none. FormatError when the pointer names a
// missing or incomplete folder.
std::string latest_checkpoint(const std::string& dir);
bool has_checkpoint(const std::string& dir);
// Steps of the step folders in out_dir/checkpoints, ascending (temp folders excluded).
std::vector<int64_t> checkpoint_steps(const std::string& out_dir);
// Removes the step folders of out_dir/checkpoints not listed in `keep` (never the one `latest`
// names) and temp folders/files left by an interrupted save.
void prune_checkpoints(const std::string& out_dir, const std::vector<int64_t>& keep);
// Loads the checkpoint latest_checkpoint(dir) names: weights into `model`, optimizer moments into
// exp_avg/exp_avg_sq (same order as model.named_parameters()); returns the state. IOError when
// there is none; FormatError when files are missing or disagree.
TrainerState load_checkpoint(const std::string& dir, model::Decoder& model, std::vector<Tensor>& exp_avg,
                             std::vector<Tensor>& exp_avg_sq);

// Exclusive use of an output folder by one training run: holds OUT/train.lock (corelm::FileLock:
// released by the kernel when the process dies, even by kill -9). IOError naming the holder's pid
// and host when another live process trains into OUT. Re-entrant within a process (train() takes
// it, and so does the CLI before it writes the tokenizer into OUT): the folder stays locked while
// any returned handle lives.
std::shared_ptr<void> lock_output_dir(const std::string& out_dir);


// ---- sequence classification with the head (src/train/classify.cc; docs/TRAINING.md) ----
//
// The model carries "score.weight" [num_labels, H] (ModelConfig::labels). A record's prompt is
// its text through the template; the head reads the final-normed hidden state of its last token
// ("last", as HF's LlamaForSequenceClassification) or the mean over its tokens ("mean").

struct ClassifyRecord {
  std::vector<TokenId> ids;  // the prompt, truncated to max_tokens (the first tokens kept)
  int64_t label = 0;         // index into the labels
  std::vector<float> teacher;  // soft target per label (distillation; sums to 1), empty: none
};

struct ClassifyDataOptions {
  std::vector<std::string> labels;  // the head's classes, in id order
  std::string text_field = "text", label_field = "label";
  std::string template_text = "{text}";  // must hold {text} once
  int64_t max_tokens = 128;
  // Distillation (--teacher-field): a field holding a teacher's probability of every label, an
  // object {label: p} over exactly `labels` (what `corelm run classify` writes as "probs") or an
  // array of p in label order; each p finite and >= 0, the sum within 1e-3 of 1 (then
  // renormalised). "" (default): not read.
  std::string teacher_field;
};

// JSONL records {text_field: string, label_field: string or integer}. FormatError "FILE:LINE: ..."
// for a malformed line, a missing field, a label outside `labels` (naming the label and the set) or,
// with teacher_field, a missing or malformed teacher distribution (naming the field and the label);
// FormatError naming the file when it holds no record. Blank lines are skipped.
std::vector<ClassifyRecord> load_classify_records(const std::string& path, const Tokenizer& tokenizer,
                                                  const ClassifyDataOptions& options);
// load_classify_records in two halves, so a caller that needs the text first (to train a
// tokenizer on it) reads the file once: the validated records with their text and FILE:LINE...
struct ClassifyText {
  std::string text;   // the text field, without the template
  int64_t label = 0;  // index into the labels
  std::string where;  // FILE:LINE, for the errors of encoding
  std::vector<float> teacher;  // with teacher_field: the soft target per label
};
std::vector<ClassifyText> read_classify_texts(const std::string& path, const ClassifyDataOptions& options);
// ... and their encoding (template applied, truncated to max_tokens).
std::vector<ClassifyRecord> encode_classify_records(const std::vector<ClassifyText>& texts, const Tokenizer& tokenizer,
                                                    const ClassifyDataOptions& options);
// Labels that occur in `records`, and how often (index = label id).
std::vector<int64_t> label_counts(const std::vector<ClassifyRecord>& records, size_t num_labels);
// Stratified split: of each class, the last round(fraction * count) records (in file order; at least
// one when the class has two or more) go to `dev`. ValueError naming --val-fraction outside (0, 1).
void stratified_split(const std::vector<ClassifyRecord>& all, double fraction, std::vector<ClassifyRecord>& train,
                      std::vector<ClassifyRecord>& dev, size_t num_labels);

// Rows padded to the longest (pad_id); targets = labels [B], lengths = real tokens [B]; when the
// rows carry teacher distributions (all of them or none: ValueError otherwise), soft_targets =
// those [B, L] f32.
Batch make_classify_batch(const std::vector<const ClassifyRecord*>& rows, TokenId pad_id);

// Training order: shuffled epochs (every record once per epoch, a fresh permutation each), or
// class-balanced draws (a uniform class, then a uniform record of it). The position is the
// generator state and the rows drawn, both checkpointed.
class ClassifySampler : public BatchSource {
 public:
  ClassifySampler(const std::vector<ClassifyRecord>& records, size_t num_labels, bool balanced, TokenId pad_id,
                  uint64_t seed);
  Batch next(int64_t batch, int64_t seq) override;  // seq is ignored: records are pre-truncated
  Generator::State state() const override { return gen_.state(); }
  void set_state(const Generator::State& s) override { gen_.set_state(s); }
  int64_t drawn() const override { return drawn_; }
  void set_drawn(int64_t rows) override { drawn_ = rows; }

 private:
  size_t record_at(int64_t position);
  const std::vector<ClassifyRecord>& records_;
  std::vector<std::vector<size_t>> by_class_;
  bool balanced_;
  TokenId pad_;
  uint64_t seed_;
  Generator gen_;
  int64_t drawn_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<size_t> perm_;
};

// Head logits [B, L] of a classification batch (recorded on the graph; with `train_body` false the
// body runs without gradient, so only score.weight learns). With `dropout` > 0 (training only) the
// pooled state goes through inverted dropout with masks drawn from `gen` before the head.
Tensor classifier_logits(const model::Decoder& model, const Batch& batch, bool train_body = true, float dropout = 0,
                         Generator* gen = nullptr);

// Logits [N, L] of records, `batch` at a time, no gradient (rows of one batch are padded to its
// longest; padding never reaches a real position under the causal mask).
std::vector<std::vector<float>> classify_logits(const model::Decoder& model, const std::vector<ClassifyRecord>& records,
                                                TokenId pad_id, int64_t batch = 32);

struct CalibrationStats {
  double accuracy = 0, nll = 0, ece = 0;  // ECE: 15 equal-width confidence bins (as eval-task)
};
CalibrationStats calibration_stats(const std::vector<std::vector<float>>& logits, const std::vector<int64_t>& labels,
                                   double temperature);
// The temperature T minimising the mean NLL of softmax(logits / T) (golden-section search on log T
// over [1/20, 20]).
double fit_temperature(const std::vector<std::vector<float>>& logits, const std::vector<int64_t>& labels);

struct ClassifyTrainOptions {
  double label_smoothing = 0;  // in [0, 1)
  // Dropout on the pooled state before the head while training (HF's classifier_dropout), in
  // [0, 1); 0: none. Each batch's masks come from a generator seeded by (seed, the batch's token
  // ids and lengths), so a resumed run draws the masks a straight run draws. Evaluation and
  // inference never drop.
  double dropout = 0;
  // Distillation: with soft targets in the batch, the loss is (1 - w) * (the label-smoothed CE on
  // the labels) + w * (the cross-entropy against the teacher's distribution, -sum_c q_c log p_c,
  // averaged over rows), w in [0, 1]. Ignored when a batch has no soft targets.
  double distill_weight = 0.5;
  uint64_t seed = 0;
  bool train_body = true;      // false: only the head learns
  int64_t eval_batch = 32;
  TokenId pad_id = 0;
};

// The head's objective for train(): cross-entropy (with label smoothing, and a teacher's soft
// targets when the batch carries them) on the head logits;
// each evaluation scores the dev records (dev_accuracy, dev_loss) and keeps a copy of the
// parameters of the best one (highest accuracy, ties by the lower loss). The copy is also written
// to out_dir/best_dev.safetensors (atomically, its step, accuracy and loss in the metadata) so a
// run stopped by a signal or a crash resumes with its best-so-far choice; a best from after the
// resumed checkpoint is dropped (the resumed run evaluates those steps again). Only the run's
// scheduled evaluations compete (every eval_every steps and the last step): the evaluation at an
// interruption is logged but not chosen, so a stopped-and-resumed run picks what a straight one
// picks.
class ClassifyObjective : public Objective {
 public:
  ClassifyObjective(const std::vector<ClassifyRecord>& dev, const ClassifyTrainOptions& options);
  Tensor loss(const model::Decoder& model, const Batch& batch) override;
  double evaluate(const model::Decoder& model, int64_t step, std::vector<std::pair<std::string, double>>& fields) override;
  bool has_best() const { return best_step_ >= 0; }
  int64_t best_step() const { return best_step_; }
  double best_accuracy() const { return best_acc_; }
  double best_loss() const { return best_loss_; }
  // Copies the best evaluation's parameters into `model` (no-op without one).
  void restore_best(model::Decoder& model) const;
  void on_start(const std::string& out_dir, int64_t resumed_step, int64_t eval_every, int64_t steps) override;

 private:
  void persist_best() const;
  const std::vector<ClassifyRecord>& dev_;
  ClassifyTrainOptions opt_;
  int64_t best_step_ = -1;
  double best_acc_ = -1, best_loss_ = 0;
  std::vector<Tensor> best_;
  std::vector<std::string> best_names_;
  std::string best_path_;  // "" until on_start
  int64_t eval_every_ = 0, steps_ = -1;  // steps_ -1: no schedule known, every evaluation competes
};

struct ClassifyFinish {
  int64_t best_step = -1;
  double dev_accuracy = 0, dev_loss = 0, temperature = 1, ece_before = 0, ece_after = 0;
};
// After train(): loads the best evaluation's weights, fits the temperature on `dev`, and replaces
// out_dir's model files (model.safetensors, then config.json with classifier_temperature; each
// written atomically) with them. The checkpoints keep the last step for --resume.
ClassifyFinish finish_classifier(model::Decoder& model, const ClassifyObjective& objective,
                                 const std::vector<ClassifyRecord>& dev, const std::string& out_dir, TokenId pad_id);

// ---- weight averaging: model soups (src/train/soup.cc; `corelm merge`; docs/TRAINING.md) ----
//
// Models fine-tuned from one initialisation (the points of a learning-rate grid) usually sit in
// one basin of the loss, so the element-wise mean of their weights is a model as fast as each of
// them and often better than the best one (Wortsman et al. 2022, "Model soups").

enum class SoupMethod { kUniform, kGreedy };
SoupMethod parse_soup_method(const std::string& name);  // "uniform" | "greedy"; ValueError naming --method
std::string soup_method_name(SoupMethod method);  // the spelling parse_soup_method reads
const std::vector<std::string>& soup_method_names();

// The element-wise mean of the models' parameters, as a decoder of their config (its
// classifier_temperature reset to 1). ValueError naming the model (`names[i]`) whose config
// differs from the first's (anything but classifier_temperature) or when fewer than two are given.
model::Decoder average_decoders(const std::vector<const model::Decoder*>& models, const std::vector<std::string>& names);

struct SoupIngredient {
  std::string name;
  double dev_accuracy = 0, dev_loss = 0;  // the model alone, at its own temperature 1
  bool kept = false;                      // in the soup
  std::string duplicate_of;               // merge_model_dirs: the earlier model with bit-identical weights ("" : none)
};
struct SoupResult {
  std::vector<SoupIngredient> ingredients;  // by dev accuracy, best first (ties: lower loss): the greedy order
  double dev_accuracy = 0, dev_loss = 0;    // the soup's, at T = 1
  double temperature = 1, ece_before = 0, ece_after = 0;  // fitted on dev, as finish_classifier
};
// A classification soup scored on `dev`: kUniform averages every model; kGreedy starts from the
// best model on dev and adds the others in that order, each only when the soup's dev accuracy
// does not fall (so the soup never scores below its best ingredient on dev). The soup's
// temperature is fitted on dev and written into its config. ValueError when a model has no head
// or the heads' labels differ, or when dev is empty.
struct Soup {
  model::Decoder decoder;
  SoupResult result;
};
Soup classifier_soup(const std::vector<const model::Decoder*>& models, const std::vector<std::string>& names,
                     const std::vector<ClassifyRecord>& dev, TokenId pad_id, SoupMethod method);

// `corelm merge`: model directories (config.json, model.safetensors, tokenizer.json) averaged
// into OUT. With `dev` (labelled JSONL, the head's labels and template) the soup is scored and
// calibrated there (classifier_soup; default method greedy); without it every model is averaged
// (method uniform; greedy needs dev). The tokenizer.json files must be byte-identical (ValueError
// naming the first that differs); OUT gets the first one's. OUT is written as save_model_dir does.
// A model whose every parameter is bit-identical to an earlier one's (the same directory given
// twice, a checkpoint that is a run's own final weights) would enter the mean twice: it is left
// out and reported as an ingredient with `duplicate_of` set (kept false; its dev scores are the
// earlier model's); fewer than two distinct models is a ValueError naming both directories.
struct MergeOptions {
  std::vector<std::string> models;
  std::string out;
  std::optional<SoupMethod> method;  // unset: greedy with dev, uniform without
  std::string dev;                   // "" : no scoring
  std::string text_field = "text", label_field = "label";
  int64_t max_tokens = 128;  // prompt tokens per dev record (train --seq)
};
struct MergeReport {
  SoupMethod method = SoupMethod::kUniform;
  bool scored = false;  // dev given: `soup` holds the scores
  SoupResult soup;      // unscored: ingredients in the given order, all kept
  int64_t parameters = 0;
};
MergeReport merge_model_dirs(const MergeOptions& options);

// ---- corelm eval ----

struct EvalOptions {
  int64_t seq = 0;    // window length; 0: the model context; otherwise 1..context
  int64_t batch = 4;  // windows per forward
};
// Mean loss over every token of `data` (non-overlapping windows: each token after the first is
// predicted once). ValueError naming --seq / --batch out of range, or data too short.
EvalResult evaluate_dataset(const model::Decoder& model, const TokenDataset& data, const EvalOptions& options);

// Weight decay applies to matrices and embeddings, not to norms and biases.
bool decays(const std::string& param_name);

}  // namespace corelm::train
