// corelm train: pretrain (text or token files) or fine-tune (--sft pairs) a decoder; see
// docs/TRAINING.md. Argument parsing and setup only; the loop lives in src/train.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/mpi.h"
#include "corelm/thread_pool.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"
#include "corelm/train.h"
#include "train/sampled_softmax.h"

namespace corelm::cli {
namespace {
namespace fs = std::filesystem;

struct TrainArgs {
  std::string preset = "tiny", config, init, sft, tokenizer, out, schedule = "cosine";
  std::vector<std::string> data;
  int64_t steps = 0, batch = 8, seq = 128, grad_accum = 1, warmup = 0, eval_every = 0, save_every = 500;
  int64_t eval_batches = 8, log_every = 10, stop_at = 0, keep_checkpoints = 2;
  bool warmup_given = false, eval_every_given = false;  // else the defaults below (from --steps)
  int threads = 1, sample_tokens = 32;
  uint64_t seed = 0;
  double lr = 2e-3, min_lr_ratio = 0.1, weight_decay = 0.1, clip = 1.0, time_budget = 0, val_fraction = 0.05;
  std::string sample_prompt;
  bool resume = false, no_progress = false;
  std::string loss = "full", compute_dtype = "f32";
  int64_t negatives = 1024;
  double count_floor = 32, sampled_alpha = 1.0;
  bool mpi = false, no_overlap = false;  // data-parallel over MPI (docs/SCALE-OUT.md)
  int64_t bucket_kb = 4096, checksum_every = 100;
};

bool is_token_file(const std::string& path) { return path.size() > 4 && path.ends_with(".bin"); }

// The checkpoint carries the tokenizer as DIR/tokenizer.json (a byte copy), so only a Hugging Face
// tokenizer.json (or a directory holding one) can be used for training.
std::string tokenizer_json_path(const std::string& given) {
  fs::path p(given);
  if (fs::is_directory(p)) p /= "tokenizer.json";
  CORELM_CHECK(p.extension() == ".json" && p.filename() != "vocab.json", ValueError, "--tokenizer: ", given,
               " is not a tokenizer.json; checkpoints carry the tokenizer as tokenizer.json, so give a Hugging Face ",
               "tokenizer.json or a directory holding one (convert others with the tokenizer tools first)");
  CORELM_CHECK(fs::exists(p), IOError, p.string(), ": missing");
  return p.string();
}

// The library's options from the arguments (the library validates them: train::TrainOptions).
train::TrainOptions train_options(const TrainArgs& a) {
  train::TrainOptions opt;
  opt.out_dir = a.out;
  opt.steps = a.steps;
  opt.time_budget_s = a.time_budget;
  opt.stop_at = a.stop_at;
  opt.batch = a.batch;
  opt.seq = a.seq;
  opt.grad_accum = a.grad_accum;
  opt.schedule.kind = train::parse_schedule(a.schedule);
  opt.schedule.lr = a.lr;
  opt.schedule.warmup = a.warmup_given ? a.warmup : std::min<int64_t>(100, a.steps / 10);
  opt.schedule.min_lr_ratio = a.min_lr_ratio;
  opt.weight_decay = static_cast<float>(a.weight_decay);
  opt.clip = static_cast<float>(a.clip);
  opt.eval_every = a.eval_every_given ? a.eval_every : std::max<int64_t>(1, a.steps / 10);
  opt.eval_batches = a.eval_batches;
  opt.save_every = a.save_every;
  opt.keep_checkpoints = a.keep_checkpoints;
  opt.log_every = a.log_every;
  opt.sample_tokens = a.sample_tokens;
  opt.sample_prompt = a.sample_prompt;
  opt.seed = a.seed;
  opt.resume = a.resume;
  opt.progress = !a.no_progress;
  opt.stop_on_signals = true;
  opt.loss = a.loss;
  opt.sampled_negatives = a.negatives;
  opt.sampled_floor = a.count_floor;
  opt.sampled_alpha = a.sampled_alpha;
  opt.compute_dtype = a.compute_dtype;
  opt.bucket_bytes = a.bucket_kb * 1024;
  opt.overlap_allreduce = !a.no_overlap;
  opt.checksum_every = a.checksum_every;
  return opt;
}

// Returns the exit code: 0, or 128 + the signal that stopped training (after its checkpoint).
// Under mpirun every rank runs this; rank 0 alone writes into --out (the others read it after
// the barrier below) and prints.
int run_rank(const TrainArgs& a, const dist::World& world) {
  set_num_threads(a.threads);
  const bool root = world.is_root();
  CORELM_CHECK(!a.data.empty() || !a.sft.empty(), ValueError, "train: give --data FILE... or --sft pairs.jsonl");
  CORELM_CHECK(a.data.empty() || a.sft.empty(), ValueError, "train: --data and --sft are exclusive");
  train::TrainOptions opt = train_options(a);
  opt.world = &world;
  if (!root) opt.progress = false;
  const bool quiet = a.no_progress || !root;
  opt.validate();  // before anything is written into --out
  train::check_val_fraction(a.val_fraction);
  // Held until the end: no second run may write the tokenizer or checkpoints into --out meanwhile.
  const std::shared_ptr<void> out_lock = root ? train::lock_output_dir(a.out) : nullptr;
  const bool resuming = a.resume && train::has_checkpoint(a.out);
  // A resumed run takes config and tokenizer from the checkpoint the pointer names.
  const std::string checkpoint = resuming ? train::latest_checkpoint(a.out) : "";
  const std::string out_tokenizer = (fs::path(a.out) / "tokenizer.json").string();

  // Config and (for --init) weights.
  std::unique_ptr<model::LoadedModel> init;
  model::ModelConfig config;
  if (resuming) config = model::ModelConfig::load((fs::path(checkpoint) / "config.json").string());
  else if (!a.init.empty()) {
    init = std::make_unique<model::LoadedModel>(model::load_model_dir(a.init));
    config = init->decoder.config();
  } else if (!a.config.empty()) config = model::ModelConfig::load(a.config);
  else config = model::ModelConfig::preset(a.preset);

  // Tokenizer: the checkpoint's, the initial model's, the one given, or one trained on the data.
  std::string tokenizer_path;
  if (resuming) tokenizer_path = (fs::path(checkpoint) / "tokenizer.json").string();
  else if (!a.init.empty()) tokenizer_path = (fs::path(a.init) / "tokenizer.json").string();
  else if (!a.tokenizer.empty()) tokenizer_path = tokenizer_json_path(a.tokenizer);
  else {
    std::vector<std::string> text_files;
    if (!a.sft.empty()) text_files.push_back(a.sft);
    for (const auto& f : a.data) {
      CORELM_CHECK(!is_token_file(f), ValueError, "train: ", f,
                   " is a token file; give --tokenizer (the tokenizer that produced it)");
      text_files.push_back(f);
    }
    if (root) {
      BpeTrainOptions bpe;
      bpe.vocab_size = static_cast<size_t>(config.vocab_size);
      bpe.progress = !quiet;
      const BpeTrainStats s = train_bpe(text_files, bpe, out_tokenizer);
      if (!quiet)
        std::cerr << "trained a byte-level BPE tokenizer: " << s.vocab_size << " tokens (" << s.merges
                  << " merges) in " << s.count_seconds + s.merge_seconds << " s -> " << out_tokenizer << "\n";
    }
    world.barrier();  // the other ranks load the tokenizer rank 0 wrote
    tokenizer_path = out_tokenizer;
  }
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(tokenizer_path);
  const int64_t tok_vocab = static_cast<int64_t>(tok->vocab_size());
  if (tok_vocab > config.vocab_size) {
    CORELM_CHECK(!resuming && a.init.empty(), ValueError, "train: tokenizer ", tokenizer_path, " has ", tok_vocab,
                 " ids, more than the model's vocab_size ", config.vocab_size);
    if (root) std::cerr << "note: vocab_size raised from " << config.vocab_size << " to the tokenizer's " << tok_vocab << "\n";
    config.vocab_size = tok_vocab;
  }

  model::Decoder decoder(config);
  if (init) {
    for (const auto& [name, t] : init->decoder.named_parameters()) decoder.load_parameter(name, t);
    init.reset();
  } else {
    decoder.init_weights(a.seed);
  }

  // Data: training windows/pairs and a fixed validation set (batched by the global batch, so N
  // ranks of --batch B validate on what one process with --batch N*B does).
  const int64_t val_batch = a.batch * world.size();
  std::unique_ptr<train::BatchSource> source;
  std::vector<train::Batch> val;
  train::TokenDataset dataset;
  std::vector<train::SftPair> pairs;
  size_t sft_val_begin = 0;
  std::vector<int64_t> counts;  // training-split token counts: the sampled softmax's proposal
  const bool sampled = a.loss == "sampled";
  if (!a.sft.empty()) {
    pairs = train::load_sft_pairs(a.sft, *tok);
    const size_t n_val = train::sft_validation_pairs(pairs.size(), a.val_fraction);
    const size_t train_end = pairs.size() - n_val;
    sft_val_begin = n_val ? train_end : 0;
    const TokenId pad = tok->pad_id().value_or(tok->eos_id().value_or(0));
    source = std::make_unique<train::SftSampler>(pairs, 0, train_end, pad, a.seed);
    if (sampled) {  // SFT targets are the outputs (and EOS)
      counts.assign(static_cast<size_t>(config.vocab_size), 0);
      for (size_t i = 0; i < train_end; ++i)
        for (TokenId t : pairs[i].output)
          if (static_cast<int64_t>(t) < config.vocab_size) ++counts[t];
    }
    for (size_t i = train_end; i < pairs.size() && static_cast<int64_t>(val.size()) < a.eval_batches; i += val_batch) {
      std::vector<const train::SftPair*> rows;
      for (size_t j = i; j < std::min(pairs.size(), i + val_batch); ++j) rows.push_back(&pairs[j]);
      val.push_back(train::make_sft_batch(rows, a.seq, pad));
    }
  } else {
    bool any_bin = false, any_text = false;
    for (const auto& f : a.data) (is_token_file(f) ? any_bin : any_text) = true;
    CORELM_CHECK(!(any_bin && any_text), ValueError, "train: --data mixes token files (.bin) and text files");
    if (any_bin && a.data.size() == 1) {
      dataset = train::TokenDataset::open(a.data[0]);
    } else if (any_bin) {
      std::vector<TokenId> ids;
      for (const auto& f : a.data) {
        train::TokenDataset d = train::TokenDataset::open(f);
        for (int64_t i = 0; i < d.size(); ++i) ids.push_back(d[i]);
      }
      dataset = train::TokenDataset::from_ids(std::move(ids));
    } else {
      dataset = train::TokenDataset::from_text_files(*tok, a.data, a.threads);
    }
    CORELM_CHECK(dataset.vocab_bound() <= config.vocab_size, ValueError, "train: the data holds token id ",
                 dataset.vocab_bound() - 1, ", outside the model's vocab_size ", config.vocab_size);
    const train::Split split = train::split_tokens(dataset.size(), a.val_fraction, a.seq);
    if (split.train_end < dataset.size())
      val = train::sequential_batches(dataset, split.train_end, dataset.size(), val_batch, a.seq, a.eval_batches);
    source = std::make_unique<train::WindowSampler>(dataset, 0, split.train_end, a.seed);
    if (sampled) counts = train::count_tokens(dataset, 0, split.train_end, config.vocab_size);
    if (!quiet)
      std::cerr << "data: " << dataset.size() << " tokens (" << split.train_end << " train, "
                << dataset.size() - split.train_end << " validation); model: "
                << config.num_parameters(false) << " non-embedding parameters\n";
  }

  // SFT samples answer the first held-out input (the default prompt would include its output).
  if (opt.sample_prompt.empty() && !pairs.empty()) opt.sample_prompt = tok->decode(pairs[sft_val_begin].input);
  opt.unigram_counts = std::move(counts);
  const train::TrainResult r = train::train(decoder, *source, val.empty() ? nullptr : &val, tok.get(),
                                            tokenizer_path, opt);
  nlohmann::ordered_json summary{{"out", a.out},
                                 {"start_step", r.start_step},
                                 {"steps", r.end_step},
                                 {"train_loss", r.last_train_loss},
                                 {"val_loss", r.last_val_loss ? nlohmann::json(*r.last_val_loss) : nlohmann::json()},
                                 {"tokens_seen", r.tokens_seen},
                                 {"tokens_per_s", r.tokens_per_s},
                                 {"threads", a.threads},
                                 {"checkpoint", r.checkpoint}};
  if (world.size() > 1) summary["ranks"] = world.size();
  if (r.stopped_by_signal) summary["stopped_by_signal"] = r.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM";
  if (root) std::cout << summary.dump() << "\n";
  if (!r.stopped_by_signal) return 0;
  if (root) std::cerr << "corelm: train: stopped by " << (r.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM") << " after step "
            << r.end_step << "; checkpoint " << r.checkpoint << " (continue with --resume)\n";
  return 128 + r.stopped_by_signal;
}

int run(const TrainArgs& a) {
  dist::World world(a.mpi);
  try {
    return run_rank(a, world);
  } catch (const std::exception& e) {
    if (world.size() <= 1) throw;
    // The other ranks would wait forever in their next collective: report and end the whole job.
    std::cerr << "corelm: error (rank " << world.rank() << " of " << world.size() << "): " << e.what() << "\n";
    world.abort(1);
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = root.add_subcommand("train", "Train (or fine-tune with --sft) a decoder; under mpirun, data-parallel over the ranks");
  c->add_option("--preset", a->preset, "model shape: tiny, small, smollm2-135m")->capture_default_str();
  c->add_option("--config", a->config, "a config.json instead of a preset");
  c->add_option("--init", a->init, "start from this model directory (fine-tuning)");
  c->add_option("--data", a->data, "text files (tokenized on the fly) or token files FILE.bin (+ FILE.bin.json)");
  c->add_option("--sft", a->sft, "supervised fine-tuning pairs: JSONL {\"input\": ..., \"output\": ...}");
  c->add_option("--tokenizer", a->tokenizer, "tokenizer to use (default: train a byte-level BPE on the data)");
  c->add_option("--out", a->out,
                "output directory: a model directory of the latest checkpoint, checkpoints/, train_log.jsonl")
      ->required();
  c->add_option("--steps", a->steps, "optimizer steps")->required();
  c->add_option("--threads", a->threads, "threads")->capture_default_str();
  c->add_option("--seed", a->seed, "seed for weights and data order")->capture_default_str();
  c->add_flag("--resume", a->resume,
              "continue from the checkpoint OUT/checkpoints/latest names (bit-identical; an output folder of the "
              "older layout resumes too)");
  c->add_option("--batch", a->batch, "sequences per micro-batch")->capture_default_str();
  c->add_option("--seq", a->seq, "tokens per sequence")->capture_default_str();
  c->add_option("--grad-accum", a->grad_accum, "micro-batches per optimizer step")->capture_default_str();
  c->add_option("--lr", a->lr, "peak learning rate")->capture_default_str();
  c->add_option("--min-lr-ratio", a->min_lr_ratio, "final lr / peak lr (cosine, wsd)")->capture_default_str();
  CLI::Option* warmup = c->add_option("--warmup", a->warmup, "warmup steps (default: min(100, steps/10))");
  c->add_option("--schedule", a->schedule, "cosine | wsd | constant")->capture_default_str();
  c->add_option("--weight-decay", a->weight_decay, "AdamW weight decay (not on norms/biases)")->capture_default_str();
  c->add_option("--clip", a->clip, "gradient clipping by global norm (0: off)")->capture_default_str();
  CLI::Option* eval_every =
      c->add_option("--eval-every", a->eval_every, "validation + sample every N steps (default: steps/10; 0: at the end)");
  c->add_option("--eval-batches", a->eval_batches, "validation batches per evaluation (0: no validation)")
      ->capture_default_str();
  c->add_option("--val-fraction", a->val_fraction, "held-out tail of the data (0: no validation)")
      ->capture_default_str();
  c->add_option("--save-every", a->save_every, "checkpoint every N steps (and at the end)")->capture_default_str();
  c->add_option("--keep-checkpoints", a->keep_checkpoints,
                "step folders kept in OUT/checkpoints (the newest; older ones are removed once a newer one is "
                "committed)")
      ->capture_default_str();
  c->add_option("--log-every", a->log_every, "progress line period when stderr is not a terminal")
      ->capture_default_str();
  c->add_option("--sample-tokens", a->sample_tokens, "greedy tokens printed after each evaluation")
      ->capture_default_str();
  c->add_option("--sample-prompt", a->sample_prompt, "prompt for the samples (default: start of validation)");
  c->add_option("--time-budget", a->time_budget, "stop (and checkpoint) after this many seconds (0: none)");
  c->add_option("--stop-at", a->stop_at,
                "stop (and checkpoint) after this step, as SIGINT/SIGTERM would (those exit with 128 + signal)");
  c->add_flag("--no-progress", a->no_progress, "no progress output on stderr");
  c->add_option("--loss", a->loss,
                "training loss: full (fused LM head + softmax over the whole vocabulary) or sampled (softmax over "
                "the batch targets plus --negatives ids drawn from the training unigram counts; validation stays "
                "full)")
      ->check(CLI::IsMember({"full", "sampled"}))
      ->capture_default_str();
  c->add_option("--negatives", a->negatives, "sampled loss: negatives drawn per micro-batch (with replacement)")
      ->capture_default_str();
  c->add_option("--count-floor", a->count_floor,
                "sampled loss: proposal q ~ max(count, floor)^alpha; the floor gives rare tokens real negatives "
                "(0 disables it)")
      ->capture_default_str();
  c->add_option("--sampled-alpha", a->sampled_alpha, "sampled loss: exponent alpha of the proposal")
      ->capture_default_str();
  c->add_flag("--mpi", a->mpi,
              "initialise MPI even when no launcher's environment is seen (mpirun/srun are detected; "
              "data-parallel training: docs/SCALE-OUT.md)");
  c->add_option("--bucket-kb", a->bucket_kb,
                "data-parallel: gradient all-reduce bucket size in KiB (default from `corelm bench allreduce`)")
      ->capture_default_str();
  c->add_flag("--no-overlap", a->no_overlap,
              "data-parallel: reduce the gradient buckets after backward instead of during it");
  c->add_option("--checksum-every", a->checksum_every,
                "data-parallel: compare a checksum of the weights across ranks every N steps (0: only at the end)")
      ->capture_default_str();
  c->add_option("--compute-dtype", a->compute_dtype, "matrix-product precision of training: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  c->callback([a, warmup, eval_every] {
    a->warmup_given = warmup->count() > 0;
    a->eval_every_given = eval_every->count() > 0;
    const int rc = run(*a);  // the output lock is released by now
    if (rc != 0) {
      std::cout.flush();
      std::exit(rc);
    }
  });
});

}  // namespace
}  // namespace corelm::cli
