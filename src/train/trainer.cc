// The training loop: micro-batches -> forward -> cross-entropy -> backward (accumulated) ->
// global-norm clipping -> AdamW at the scheduled learning rate -> log, evaluate, checkpoint.
// Nothing in the loop draws randomness except the batch source, whose state is checkpointed, and
// the sampled-softmax negatives, a pure function of (seed, step, micro-batch), so a resumed run
// repeats the uninterrupted one bit for bit. The loss is the fused LM head + cross-entropy
// (ops::linear_cross_entropy: no [B*T, V] logits) or its sampled-softmax variant. A non-finite
// loss or gradient norm stops the run before the optimizer step (nothing of it is saved); SIGINT /
// SIGTERM (stop_on_signals) stop it after the current step with a checkpoint.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "corelm/autocast.h"
#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/ops.h"
#include "corelm/optim.h"
#include "corelm/train.h"
#include "ops/vector_math.h"
#include "train/checkpoint_internal.h"
#include "train/data_parallel.h"
#include "train/sampled_softmax.h"

namespace corelm::train {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// The signal that asked the running train() to stop (0: none). Lock-free, so the handler may set it.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig, std::memory_order_relaxed); }

// Installs the SIGINT / SIGTERM handlers for one train() call and restores the previous ones.
// SA_RESETHAND: the handler runs once, so a second signal has its default effect (kill), which is
// safe because a checkpoint is committed whole or not at all.
class SignalStop {
 public:
  explicit SignalStop(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalStop() {
    if (!enabled_) return;
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  int requested() const { return enabled_ ? g_stop_signal.load(std::memory_order_relaxed) : 0; }
  SignalStop(const SignalStop&) = delete;
  SignalStop& operator=(const SignalStop&) = delete;

 private:
  bool enabled_;
  struct sigaction old_int_ {}, old_term_ {};
};

bool finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t total = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (total >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(total / 60), static_cast<long long>(total % 60));
  return buf;
}

// Where a micro-batch's sampled negatives come from (the draw is a function of seed/step/micro).
struct SampledDraw {
  const UnigramProposal* proposal = nullptr;
  int64_t negatives = 0;
  uint64_t seed = 0;
  int64_t step = 0, micro_batch = 0;
  const Tensor* candidate_targets = nullptr;  // data-parallel: the global micro-batch's targets
};

// Mean loss of one batch; the backward of the returned tensor accumulates into .grad(). Full
// softmax unless `sampled` is given.
Tensor batch_loss(const model::Decoder& model, const Batch& b, const SampledDraw* sampled = nullptr) {
  const int64_t n = b.ids.numel();
  const Tensor targets = b.targets.reshape({n});
  if (!sampled && model.inference_prepared() && !autograd::grad_mode_enabled()) {
    // Evaluation of a model packed for inference (corelm eval --precision bf16): score with the
    // packed head the fast forward uses, so the figure matches the model as it will be run.
    Tensor logits = model.forward(b.ids);
    return ops::cross_entropy(ops::reshape(logits, {n, logits.size(-1)}), targets);
  }
  Tensor hidden = model.forward_hidden(b.ids);
  hidden = ops::reshape(hidden, {n, hidden.size(-1)});
  const Tensor& weight = model.lm_head_weight();
  if (!sampled) return ops::linear_cross_entropy(hidden, weight, targets);
  const CandidateSet c = draw_candidates(*sampled->proposal, sampled->negatives,
                                         sampled->candidate_targets ? *sampled->candidate_targets : targets,
                                         sampled->seed, sampled->step, sampled->micro_batch);
  return ops::sampled_linear_cross_entropy(hidden, weight, targets, c.candidates, c.log_correction);
}

double global_grad_norm(const std::vector<Tensor>& params) {
  double sumsq = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g = g.contiguous();
    // Vectorised, double accumulation in a fixed order (ops/vector_math.h).
    sumsq += ops::dot_f64(g.data<float>(), g.data<float>(), g.numel());
  }
  return std::sqrt(sumsq);
}

// torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
void clip_gradients(const std::vector<Tensor>& params, double norm, float max_norm) {
  const float coef = static_cast<float>(static_cast<double>(max_norm) / (norm + 1e-6));
  if (coef >= 1.0f) return;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // In place: leaf gradients never share memory (autograd clones on first accumulation).
    CORELM_CHECK(g.is_contiguous() && g.dtype() == DType::F32, ValueError, "clip_gradients: unexpected gradient layout");
    float* d = g.data<float>();
    for (int64_t i = 0, n = g.numel(); i < n; ++i) d[i] *= coef;
  }
}

std::string printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r' || c == '\t') out += ' ';
    else out += c;
  }
  return out;
}

std::string json_dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// On resume, log lines of steps after the checkpoint (written before a crash) are dropped so the
// log reads as one run.
void truncate_log(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in.good()) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.contains("step") && j["step"].get<int64_t>() > step) continue;
    } catch (const nlohmann::json::exception&) {
      continue;  // a torn last line
    }
    kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

}  // namespace

void TrainOptions::validate() const {
  CORELM_CHECK(!out_dir.empty(), ValueError, "train: no output directory (--out)");
  CORELM_CHECK(steps > 0, ValueError, "train: --steps must be positive, got ", steps);
  CORELM_CHECK(stop_at >= 0, ValueError, "train: --stop-at must be >= 0 (0: no stop), got ", stop_at);
  CORELM_CHECK(std::isfinite(time_budget_s) && time_budget_s >= 0, ValueError,
               "train: --time-budget must be >= 0 seconds (0: no budget), got ", time_budget_s);
  CORELM_CHECK(batch > 0, ValueError, "train: --batch must be positive, got ", batch);
  CORELM_CHECK(seq > 0, ValueError, "train: --seq must be positive, got ", seq);
  CORELM_CHECK(grad_accum > 0, ValueError, "train: --grad-accum must be positive, got ", grad_accum);
  CORELM_CHECK(std::isfinite(schedule.lr) && schedule.lr > 0, ValueError,
               "train: --lr must be a positive finite number, got ", schedule.lr);
  CORELM_CHECK(schedule.warmup >= 0, ValueError, "train: --warmup must be >= 0 steps, got ", schedule.warmup);
  CORELM_CHECK(finite_in(schedule.min_lr_ratio, 0, 1), ValueError,
               "train: --min-lr-ratio must be in [0, 1] (the final learning rate is lr * ratio), got ",
               schedule.min_lr_ratio);
  CORELM_CHECK(finite_in(schedule.decay_fraction, 0, 1), ValueError,
               "train: --decay-fraction must be in [0, 1] (the fraction of --steps the wsd schedule decays over), got ", schedule.decay_fraction);
  CORELM_CHECK(finite_in(weight_decay, 0, 1e6), ValueError, "train: --weight-decay must be >= 0, got ", weight_decay);
  CORELM_CHECK(finite_in(beta1, 0, 1) && beta1 < 1, ValueError, "train: AdamW beta1 must be in [0, 1), got ", beta1);
  CORELM_CHECK(finite_in(beta2, 0, 1) && beta2 < 1, ValueError, "train: AdamW beta2 must be in [0, 1), got ", beta2);
  CORELM_CHECK(std::isfinite(eps) && eps > 0, ValueError, "train: AdamW eps must be positive, got ", eps);
  CORELM_CHECK(std::isfinite(clip) && clip >= 0, ValueError,
               "train: --clip must be >= 0 (the gradient norm bound; 0: no clipping), got ", clip);
  CORELM_CHECK(eval_every >= 0, ValueError, "train: --eval-every must be >= 0, got ", eval_every);
  CORELM_CHECK(eval_batches >= 0, ValueError, "train: --eval-batches must be >= 0 (0: no validation), got ",
               eval_batches);
  CORELM_CHECK(save_every >= 0, ValueError, "train: --save-every must be >= 0 (0: only at the end), got ",
               save_every);
  CORELM_CHECK(keep_checkpoints >= 1, ValueError, "train: --keep-checkpoints must be >= 1, got ", keep_checkpoints);
  CORELM_CHECK(log_every >= 1, ValueError, "train: --log-every must be >= 1, got ", log_every);
  CORELM_CHECK(sample_tokens >= 0, ValueError, "train: --sample-tokens must be >= 0, got ", sample_tokens);
  CORELM_CHECK(loss == "full" || loss == "sampled", ValueError, "train: unknown loss '", loss,
               "' (--loss: expected full or sampled)");
  CORELM_CHECK(sampled_negatives >= 1, ValueError, "train: --negatives must be >= 1, got ", sampled_negatives);
  CORELM_CHECK(std::isfinite(sampled_floor) && sampled_floor >= 0, ValueError,
               "train: --count-floor must be >= 0, got ", sampled_floor);
  CORELM_CHECK(std::isfinite(sampled_alpha) && sampled_alpha >= 0, ValueError,
               "train: --sampled-alpha must be >= 0, got ", sampled_alpha);
  ops::parse_compute_dtype(compute_dtype);
  CORELM_CHECK(bucket_bytes >= 1024 && bucket_bytes <= (int64_t{1} << 30), ValueError,
               "train: --bucket-kb must be between 1 and 1048576 (KiB), got ", bucket_bytes / 1024.0);
  CORELM_CHECK(checksum_every >= 0, ValueError, "train: --checksum-every must be >= 0 (0: only at the end), got ",
               checksum_every);
}

EvalResult evaluate_dataset(const model::Decoder& model, const TokenDataset& data, const EvalOptions& options) {
  const int64_t context = model.config().max_position_embeddings;
  CORELM_CHECK(options.seq >= 0 && options.seq <= context, ValueError, "eval: --seq must be between 1 and the model ",
               "context ", context, " (or 0 for the context), got ", options.seq);
  CORELM_CHECK(options.batch > 0, ValueError, "eval: --batch must be positive, got ", options.batch);
  CORELM_CHECK(data.size() >= 2, ValueError, "eval: the data holds ", data.size(), " tokens; need at least 2");
  CORELM_CHECK(data.vocab_bound() <= model.config().vocab_size, ValueError, "eval: the data holds token id ",
               data.vocab_bound() - 1, ", outside the model's vocab_size ", model.config().vocab_size);
  const int64_t seq = options.seq > 0 ? options.seq : context;
  return evaluate(model, sequential_batches(data, 0, data.size(), options.batch, seq));
}

EvalResult evaluate(const model::Decoder& model, const std::vector<Batch>& batches) {
  autograd::NoGradGuard no_grad;
  double sum = 0;
  int64_t tokens = 0;
  for (const Batch& b : batches) {
    int64_t n = 0;
    for (int64_t t : b.targets.to_int_vector()) n += t != -100;
    if (n == 0) continue;
    sum += batch_loss(model, b).item() * static_cast<double>(n);
    tokens += n;
  }
  return EvalResult{tokens ? sum / static_cast<double>(tokens) : std::numeric_limits<double>::quiet_NaN(), tokens};
}

std::vector<TokenId> greedy_generate(const model::Decoder& model, std::vector<TokenId> prompt, int new_tokens,
                                     std::optional<TokenId> eos, int64_t vocab_limit) {
  CORELM_CHECK(!prompt.empty(), ValueError, "greedy_generate: empty prompt");
  autograd::NoGradGuard no_grad;
  const int64_t context = model.config().max_position_embeddings;
  std::vector<TokenId> out;
  for (int i = 0; i < new_tokens; ++i) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(prompt.size()), context);
    std::vector<int64_t> ids(prompt.end() - len, prompt.end());
    Tensor logits = model.forward(Tensor::from_vector(ids, {1, len}));
    const int64_t vocab = vocab_limit > 0 ? std::min<int64_t>(vocab_limit, logits.size(-1)) : logits.size(-1);
    Tensor last = logits.select(1, len - 1).contiguous();
    const float* d = last.data<float>();
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (d[v] > d[best]) best = v;
    out.push_back(static_cast<TokenId>(best));
    prompt.push_back(static_cast<TokenId>(best));
    if (eos && best == *eos) break;
  }
  return out;
}

TrainResult train(model::Decoder& model, BatchSource& data, const std::vector<Batch>* val, const Tokenizer* tokenizer,
                  const std::string& tokenizer_json, const TrainOptions& opt) {
  opt.validate();
  CORELM_CHECK(opt.seq <= model.config().max_position_embeddings, ValueError, "train: --seq ", opt.seq,
               " exceeds the model context (max_position_embeddings = ", model.config().max_position_embeddings, ")");
  const ops::ComputeDType compute = ops::parse_compute_dtype(opt.compute_dtype);
  // The bf16 kernel is chosen (and CORELM_BF16_GEMM checked) before anything is written or timed.
  if (compute == ops::ComputeDType::BF16) ops::bf16_gemm_kernel();
  std::unique_ptr<UnigramProposal> proposal;
  if (opt.loss == "sampled") {
    CORELM_CHECK(static_cast<int64_t>(opt.unigram_counts.size()) == model.config().vocab_size, ValueError,
                 "train: the sampled loss needs one token count per vocabulary id (", model.config().vocab_size,
                 "), got ", opt.unigram_counts.size());
    CORELM_CHECK(opt.sampled_negatives >= 1 && opt.sampled_negatives <= model.config().vocab_size, ValueError,
                 "train: --negatives must be in [1, ", model.config().vocab_size, "] (the vocabulary size), got ",
                 opt.sampled_negatives);
    proposal = std::make_unique<UnigramProposal>(opt.unigram_counts, opt.sampled_floor, opt.sampled_alpha);
  }
  // Data-parallel: only rank 0 touches out_dir (lock, checkpoints, log); it sends the others the
  // starting point below.
  const bool root = !opt.world || opt.world->is_root();
  // One run per output folder; then clear what an interrupted save of an earlier run left.
  const std::shared_ptr<void> out_lock = root ? lock_output_dir(opt.out_dir) : nullptr;
  if (root) prune_checkpoints(opt.out_dir, checkpoint_steps(opt.out_dir));
  // Read once: on resume the file is the checkpoint's own, which pruning may remove later.
  std::optional<std::string> tokenizer_bytes;
  if (!tokenizer_json.empty()) tokenizer_bytes = detail::read_file(tokenizer_json);
  const SignalStop signals(opt.stop_on_signals);

  model.set_requires_grad(true);
  const auto& named = model.named_parameters();
  std::vector<Tensor> params = model.parameters();
  optim::AdamW adam(params, optim::AdamWOptions{static_cast<float>(opt.schedule.lr), opt.beta1, opt.beta2, opt.eps,
                                                opt.weight_decay});
  for (size_t i = 0; i < named.size(); ++i)
    if (!decays(named[i].first)) adam.set_weight_decay(i, 0.0f);
  Schedule sched = opt.schedule;
  sched.total = opt.steps;

  TrainResult result;
  int64_t step = 0, tokens_seen = 0;
  uint64_t draw_seed = opt.seed;  // the sampled negatives' seed: the checkpoint's on resume
  const std::string log_path = (fs::path(opt.out_dir) / "train_log.jsonl").string();
  // The checkpoints of this run's lineage (the resumed one and those before it, then each save),
  // oldest first: --keep-checkpoints keeps the newest of them. A run without --resume starts
  // over, so its first save drops the folder's older checkpoints (after its pointer moved).
  std::vector<int64_t> lineage;
  int64_t saved_step = -1;
  if (root && opt.resume && has_checkpoint(opt.out_dir)) {
    std::vector<Tensor> m = adam.exp_avg(), v = adam.exp_avg_sq();
    result.checkpoint = latest_checkpoint(opt.out_dir);
    detail::sync_model_view(opt.out_dir);  // a save killed between its pointer and its links
    TrainerState st = load_checkpoint(opt.out_dir, model, m, v);
    for (int64_t s : checkpoint_steps(opt.out_dir))
      if (s <= st.step) lineage.push_back(s);
    saved_step = st.step;
    adam.set_step_count(st.step);
    data.set_state(st.sampler);
    data.set_drawn(st.rows_drawn);
    step = st.step;
    tokens_seen = st.tokens_seen;
    draw_seed = st.seed;
    if (compute == ops::ComputeDType::BF16 && !st.bf16_gemm.empty()) {
      const std::string note = ops::keep_bf16_gemm_kernel(st.bf16_gemm);
      if (opt.progress && !note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    }
    truncate_log(log_path, step);
    if (opt.progress) std::fprintf(stderr, "resuming %s at step %lld\n", opt.out_dir.c_str(), static_cast<long long>(step));
  } else if (root) {
    std::ofstream(log_path, std::ios::trunc);
  }
  DataParallel dp(opt.world, params, opt);
  CORELM_CHECK(!(dp.enabled() && opt.objective), ValueError,
               "train: a task objective (--task classify) trains in one process, not over MPI ranks");
  if (dp.enabled()) {
    DataParallelStart at{step, tokens_seen, data.drawn(), data.state(), draw_seed};
    dp.broadcast_start(params, adam.exp_avg(), adam.exp_avg_sq(), at);
    step = at.step;
    tokens_seen = at.tokens_seen;
    data.set_drawn(at.rows_drawn);
    data.set_state(at.sampler);
    draw_seed = at.draw_seed;
    adam.set_step_count(step);
  }
  result.start_step = step;
  if (opt.objective) opt.objective->on_start(opt.out_dir, saved_step, opt.eval_every, opt.steps);
  std::ofstream log;
  if (root) {
    log.open(log_path, std::ios::app);
    CORELM_CHECK(log.good(), IOError, log_path, ": cannot open for writing");
  }

  auto save = [&](int64_t at_step) {
    if (!root || at_step == saved_step) return;  // already on disk (a resume that trained no step)
    TrainerState st;
    st.step = at_step;
    st.tokens_seen = tokens_seen;
    st.rows_drawn = data.drawn();
    st.sampler = data.state();
    st.seed = draw_seed;
    st.schedule = schedule_name(sched.kind);
    st.lr = adam.lr();
    if (compute == ops::ComputeDType::BF16) st.bf16_gemm = ops::bf16_gemm_kernel();
    try {
      result.checkpoint = detail::save_checkpoint_bytes(opt.out_dir, model, adam.exp_avg(), adam.exp_avg_sq(), st,
                                                        tokenizer_bytes ? &*tokenizer_bytes : nullptr);
    } catch (const IOError& e) {
      throw IOError("train: saving the checkpoint of step " + std::to_string(at_step) + " failed (" + e.what() +
                    "); " +
                    (result.checkpoint.empty() ? std::string("no earlier checkpoint exists")
                                               : "the last good checkpoint is still " + result.checkpoint));
    } catch (const TrainingDiverged& e) {
      throw TrainingDiverged(std::string(e.what()) + "; " +
                             (result.checkpoint.empty() ? std::string("no earlier checkpoint exists")
                                                        : "the last good checkpoint is " + result.checkpoint));
    }
    saved_step = at_step;
    if (lineage.empty() || lineage.back() != at_step) lineage.push_back(at_step);
    const size_t keep = static_cast<size_t>(std::min<int64_t>(opt.keep_checkpoints, static_cast<int64_t>(lineage.size())));
    prune_checkpoints(opt.out_dir, std::vector<int64_t>(lineage.end() - static_cast<std::ptrdiff_t>(keep), lineage.end()));
  };

  std::vector<TokenId> sample_prompt;
  if (!opt.sample_prompt.empty() && tokenizer) sample_prompt = tokenizer->encode(opt.sample_prompt);
  else if (val && !val->empty()) {
    auto ids = val->front().ids.slice(0, 0, 1).to_int_vector();
    for (size_t i = 0; i < ids.size() && i < 8; ++i) sample_prompt.push_back(static_cast<TokenId>(ids[i]));
  }

  const bool tty = opt.progress && isatty(fileno(stderr));
  const Clock::time_point start = Clock::now();
  double train_seconds = 0;
  int64_t run_tokens = 0;
  const int64_t last_step = opt.stop_at > 0 ? std::min(opt.steps, opt.stop_at) : opt.steps;

  auto run_eval = [&](nlohmann::ordered_json& rec, int64_t at_step, double train_loss) {
    if (!root) return;  // data-parallel: rank 0 evaluates
    if (opt.objective) {  // the task's own evaluation (e.g. dev accuracy of the classification head)
      std::vector<std::pair<std::string, double>> fields;
      const double v = opt.objective->evaluate(model, at_step, fields);
      for (const auto& [key, x] : fields) rec[key] = x;
      if (!std::isfinite(v)) return;
      rec["val_loss"] = v;
      result.last_val_loss = v;
      result.curve.push_back(CurvePoint{at_step, train_loss, v});
      if (opt.progress) {
        if (tty) std::fputs("\r\x1b[K", stderr);
        std::fprintf(stderr, "step %lld | train loss %.4f | val loss %.4f", static_cast<long long>(at_step), train_loss, v);
        for (const auto& [key, x] : fields) std::fprintf(stderr, " | %s %.4f", key.c_str(), x);
        std::fputs("\n", stderr);
      }
      return;
    }
    if (!val || val->empty()) return;
    const EvalResult ev = evaluate(model, *val);
    if (ev.tokens == 0) return;  // nothing to score: no val_loss rather than a made-up one
    rec["val_loss"] = ev.mean_loss;
    result.last_val_loss = ev.mean_loss;
    result.curve.push_back(CurvePoint{at_step, train_loss, ev.mean_loss});
    std::string sample;
    if (opt.sample_tokens > 0 && !sample_prompt.empty()) {
      auto gen = greedy_generate(model, sample_prompt, opt.sample_tokens,
                                 tokenizer ? tokenizer->eos_id() : std::nullopt,
                                 tokenizer ? static_cast<int64_t>(tokenizer->vocab_size()) : 0);
      if (tokenizer) {
        sample = tokenizer->decode(sample_prompt) + "|" + tokenizer->decode(gen);
      } else {
        for (TokenId t : gen) sample += std::to_string(t) + " ";
      }
      rec["sample"] = sample;
    }
    if (opt.progress) {
      if (tty) std::fputs("\r\x1b[K", stderr);
      std::fprintf(stderr, "step %lld | train loss %.4f | val loss %.4f | sample: %s\n",
                   static_cast<long long>(at_step), train_loss, ev.mean_loss, printable(sample).c_str());
    }
  };

  while (step < last_step) {
    if (const int sig = static_cast<int>(dp.max(signals.requested()))) {
      result.stopped_by_signal = sig;
      break;
    }
    const Clock::time_point t0 = Clock::now();
    adam.zero_grad();
    double loss_value = 0;
    int64_t step_tokens = 0;
    for (int64_t a = 0; a < opt.grad_accum; ++a) {
      // Data-parallel: the global micro-batch (every rank draws it), of which this rank trains on its rows.
      Batch b = data.next(opt.batch * dp.size(), opt.seq);
      step_tokens += b.tokens();
      const DataParallel::Share share = dp.take_rows(b);
      if (share.local_targets == 0 && dp.enabled()) continue;  // nothing to learn here; zeros in the sum
      const auto reduce_during_backward = dp.watch_backward(a + 1 == opt.grad_accum);
      ops::ComputeDTypeScope precision(compute);
      SampledDraw draw{proposal.get(), opt.sampled_negatives, draw_seed, step, a, dp.enabled() ? &b.targets : nullptr};
      Tensor loss = opt.objective ? opt.objective->loss(model, share.local)
                                  : batch_loss(model, share.local, proposal ? &draw : nullptr);
      if (opt.grad_accum > 1) loss = ops::scale(loss, 1.0f / static_cast<float>(opt.grad_accum));
      if (dp.enabled()) loss = ops::scale(loss, static_cast<float>(share.weight));
      loss.backward();
      loss_value += loss.item();
    }
    dp.reduce_gradients();
    loss_value = dp.sum(loss_value);
    const double grad_norm = global_grad_norm(params);
    if (!std::isfinite(loss_value) || !std::isfinite(grad_norm)) {
      nlohmann::ordered_json rec;
      rec["step"] = step + 1;
      rec["loss"] = loss_value;  // NaN / inf are written as null
      rec["grad_norm"] = grad_norm;
      rec["error"] = "non-finite loss or gradient norm; stopped";
      log << json_dump(rec) << "\n";
      log.flush();
      std::ostringstream msg;
      msg << "train: training diverged at step " << step + 1 << ": loss " << loss_value << ", gradient norm "
          << grad_norm << " (learning rate " << sched.at(step) << "); stopped without saving it. ";
      if (result.checkpoint.empty())
        msg << "No checkpoint was saved before it";
      else
        msg << "The last good checkpoint is " << result.checkpoint << " (--resume continues from it)";
      msg << "; try a lower --lr, a longer --warmup or --clip 1";
      throw TrainingDiverged(msg.str());
    }
    if (opt.clip > 0) clip_gradients(params, grad_norm, opt.clip);
    const double lr = sched.at(step);
    adam.set_lr(static_cast<float>(lr));
    adam.step();
    adam.zero_grad();
    ++step;
    dp.after_update(step, opt.save_every > 0 && step % opt.save_every == 0);
    tokens_seen += step_tokens;
    const double dt = seconds_since(t0);
    train_seconds += dt;
    run_tokens += step_tokens;
    const double tok_s = dt > 0 ? static_cast<double>(step_tokens) / dt : 0;
    result.last_train_loss = loss_value;

    nlohmann::ordered_json rec;
    rec["step"] = step;
    rec["loss"] = loss_value;
    rec["lr"] = lr;
    rec["grad_norm"] = grad_norm;
    rec["tokens_per_s"] = tok_s;
    rec["tokens_seen"] = tokens_seen;
    if (dp.enabled()) rec["allreduce_s"] = dp.last_reduce_seconds();
    rec["elapsed_s"] = seconds_since(start);
    if (compute == ops::ComputeDType::BF16 && step == result.start_step + 1) rec["bf16_gemm"] = ops::bf16_gemm_kernel();
    const bool budget_over = dp.max(opt.time_budget_s > 0 && seconds_since(start) >= opt.time_budget_s) != 0;
    const bool final_step = step == last_step || budget_over;
    if ((opt.eval_every > 0 && step % opt.eval_every == 0) || final_step) {
      run_eval(rec, step, loss_value);
    }
    log << json_dump(rec) << "\n";
    log.flush();

    if (opt.progress && (tty || step % std::max<int64_t>(opt.log_every, 1) == 0 || final_step)) {
      const double per_step = seconds_since(start) / static_cast<double>(step - result.start_step);
      const double eta = per_step * static_cast<double>(last_step - step);
      std::fprintf(stderr, "%sstep %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | ETA %s%s", tty ? "\r\x1b[K" : "",
                   static_cast<long long>(step), static_cast<long long>(opt.steps), loss_value, lr,
                   train_seconds > 0 ? static_cast<double>(run_tokens) / train_seconds : 0.0,
                   format_duration(eta).c_str(), tty ? "" : "\n");
    }
    if (opt.save_every > 0 && step % opt.save_every == 0 && !final_step) save(step);
    if (budget_over) {
      result.stopped_by_time_budget = step != last_step;
      break;
    }
  }
  if (tty) std::fputs("\n", stderr);
  dp.check_replicas(step);
  save(step);
  result.end_step = step;
  result.tokens_seen = tokens_seen;
  result.tokens_per_s = train_seconds > 0 ? static_cast<double>(run_tokens) / train_seconds : 0;
  return result;
}

}  // namespace corelm::train
