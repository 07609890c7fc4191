// corelm train: pretrain (text or token files) or fine-tune (--sft pairs) a decoder; see
// docs/TRAINING.md. Argument parsing and setup only; the loop lives in src/train.
#include <signal.h>

#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli_escapes.h"
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
  std::optional<uint64_t> data_seed;  // classify: the batch order's seed alone (default: seed)
  double lr = 2e-3, min_lr_ratio = 0.1, decay_fraction = 0.2, weight_decay = 0.1, clip = 1.0, time_budget = 0, val_fraction = 0.05;
  std::string sample_prompt;
  bool resume = false, no_progress = false;
  std::string loss = "full", compute_dtype = "f32";
  int64_t negatives = 1024;
  double count_floor = 32, sampled_alpha = 1.0;
  // --task classify (run_classify below)
  std::string task = "lm", text_field = "text", label_field = "label", template_text = "{text}", dev, pooling;
  std::vector<std::string> labels;
  double epochs = 0, label_smoothing = 0, classifier_dropout = 0, distill_weight = 0.5;
  std::string teacher_field;
  bool balance = false, freeze_body = false, val_fraction_given = false;
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

// Where a run starts, the same for --task lm and --task classify: a resumed run takes config and
// tokenizer from the checkpoint the pointer names, else from --init (whose weights it loads into
// init), else --config/--preset and --tokenizer.
struct RunStart {
  bool resuming = false;
  std::string checkpoint;     // the step folder resumed from ("" when not resuming)
  std::string out_tokenizer;  // OUT/tokenizer.json
  std::unique_ptr<model::LoadedModel> init;
  model::ModelConfig config;
};

RunStart run_start(const TrainArgs& a) {
  RunStart s;
  s.resuming = a.resume && train::has_checkpoint(a.out);
  s.checkpoint = s.resuming ? train::latest_checkpoint(a.out) : "";
  s.out_tokenizer = (fs::path(a.out) / "tokenizer.json").string();
  if (s.resuming) s.config = model::ModelConfig::load((fs::path(s.checkpoint) / "config.json").string());
  else if (!a.init.empty()) {
    s.init = std::make_unique<model::LoadedModel>(model::load_model_dir(a.init));
    s.config = s.init->decoder.config();
  } else if (!a.config.empty()) s.config = model::ModelConfig::load(a.config);
  else s.config = model::ModelConfig::preset(a.preset);
  return s;
}

// The tokenizer the run starts from: the checkpoint's, --init's or --tokenizer; "" when none is
// given (the caller trains one into out_tokenizer).
std::string given_tokenizer_path(const TrainArgs& a, const RunStart& s) {
  if (s.resuming) return (fs::path(s.checkpoint) / "tokenizer.json").string();
  if (!a.init.empty()) return (fs::path(a.init) / "tokenizer.json").string();
  if (!a.tokenizer.empty()) return tokenizer_json_path(a.tokenizer);
  return "";
}

// A tokenizer with more ids than the config's vocab_size raises it, unless the weights come from a
// checkpoint or --init (their embedding rows are fixed). Returns whether it was raised.
bool fit_vocab_to_tokenizer(const TrainArgs& a, const RunStart& s, const std::string& tokenizer_path,
                            const Tokenizer& tok, model::ModelConfig& config) {
  const int64_t tok_vocab = static_cast<int64_t>(tok.vocab_size());
  if (tok_vocab <= config.vocab_size) return false;
  CORELM_CHECK(!s.resuming && a.init.empty(), ValueError, "train: tokenizer ", tokenizer_path, " has ", tok_vocab,
               " ids, more than the model's vocab_size ", config.vocab_size);
  config.vocab_size = tok_vocab;
  return true;
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
  opt.schedule.decay_fraction = a.decay_fraction;
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
int run_classify(const TrainArgs& a);

// Under mpirun every rank runs this; rank 0 alone writes into --out (the others read it after
// the barrier below) and prints.
int run_rank(const TrainArgs& a, const dist::World& world) {
  set_num_threads(a.threads);
  if (a.task == "classify") {
    CORELM_CHECK(world.size() <= 1, ValueError, "train --task classify runs in one process (not under mpirun with ",
                 world.size(), " ranks); data-parallel training is for --task lm");
    return run_classify(a);
  }
  CORELM_CHECK(a.labels.empty() && a.dev.empty() && a.epochs == 0 && a.teacher_field.empty() && !a.data_seed,
               ValueError, "train: --labels, --dev, --epochs, --teacher-field and --data-seed are for --task classify");
  CORELM_CHECK(a.steps > 0, ValueError, "train: --steps is required (a positive number of optimizer steps)");
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
  // Config, (for --init) weights and tokenizer: the checkpoint's, the initial model's, the ones
  // given, or (tokenizer) one trained on the data.
  RunStart start = run_start(a);
  const std::string& out_tokenizer = start.out_tokenizer;
  std::unique_ptr<model::LoadedModel> init = std::move(start.init);
  model::ModelConfig& config = start.config;
  std::string tokenizer_path = given_tokenizer_path(a, start);
  if (tokenizer_path.empty()) {
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
  const int64_t old_vocab = config.vocab_size;
  if (fit_vocab_to_tokenizer(a, start, tokenizer_path, *tok, config) && root)
    std::cerr << "note: vocab_size raised from " << old_vocab << " to the tokenizer's " << config.vocab_size << "\n";

  CORELM_CHECK(!config.has_classifier(), ValueError, "train: ", a.init.empty() ? a.out : a.init,
               " has a classification head (", config.labels.size(),
               " labels); language-model training (--data/--sft) would leave it untrained: continue it with "
               "--task classify, or start from a model without a head");
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
  const char* signal_name = r.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM";
  if (r.stopped_by_signal) summary["stopped_by_signal"] = signal_name;
  if (r.stopped_by_time_budget) summary["stopped_by_time_budget"] = true;
  if (root) std::cout << summary.dump() << "\n";
  // A run that ends before its last step says why, where it stopped and how to go on.
  if (root && (r.stopped_by_signal || r.stopped_by_time_budget)) {
    std::cerr << "corelm: train: ";
    if (r.stopped_by_signal)
      std::cerr << "stopped by " << signal_name << " after step " << r.end_step;
    else
      std::cerr << "--time-budget " << a.time_budget << " s stopped the run after step " << r.end_step
                << ", before its last step";
    std::cerr << "; checkpoint " << r.checkpoint << " (continue with --resume)\n";
  }
  return r.stopped_by_signal ? 128 + r.stopped_by_signal : 0;
}

// --task classify: records -> the head's cross-entropy through train() (train::ClassifyObjective),
// then the best dev evaluation's weights with a fitted temperature as OUT's model.
int run_classify(const TrainArgs& a) {
  CORELM_CHECK(a.sft.empty(), ValueError, "train: --sft is for --task lm (label-likelihood SFT); --task classify "
               "reads --data records {\"text\": ..., \"label\": ...}");
  CORELM_CHECK(a.data.size() == 1, ValueError, "train --task classify: give one --data FILE (JSONL records), got ",
               a.data.size());
  CORELM_CHECK(a.steps > 0 || a.epochs > 0, ValueError, "train --task classify: give --steps N or --epochs N");
  CORELM_CHECK(a.steps == 0 || a.epochs == 0, ValueError, "train --task classify: --steps and --epochs are exclusive");
  CORELM_CHECK(std::isfinite(a.epochs) && a.epochs >= 0, ValueError, "train: --epochs must be positive, got ", a.epochs);
  const std::shared_ptr<void> out_lock = train::lock_output_dir(a.out);
  RunStart start = run_start(a);
  const bool resuming = start.resuming;
  const std::string& out_tokenizer = start.out_tokenizer;
  std::unique_ptr<model::LoadedModel> init = std::move(start.init);
  model::ModelConfig& config = start.config;
  // Labels, template and pooling: given, else the model's (a second round keeps its head).
  std::vector<std::string> labels = a.labels.empty() ? config.labels : a.labels;
  CORELM_CHECK(!labels.empty(), ValueError, "train --task classify: give --labels A,B,... (the model has no head)");
  if (config.has_classifier() && config.labels != labels) {
    std::string given, head;
    for (const auto& l : labels) given += (given.empty() ? "" : ",") + l;
    for (const auto& l : config.labels) head += (head.empty() ? "" : ",") + l;
    CORELM_CHECK(!resuming, ValueError, "train --resume: --labels (", given, ") differ from the checkpoint's head (",
                 head, "); resume with the same labels");
    if (!a.no_progress)
      std::cerr << "note: --labels (" << given << ") differ from the model's head (" << head
                << "): the body is kept, the head starts anew\n";
  }
  std::string tmpl = unescape(a.template_text);
  if (tmpl == "{text}" && config.has_classifier() && !config.classifier_template.empty())
    tmpl = config.classifier_template;
  const std::string pooling = !a.pooling.empty() ? a.pooling : config.has_classifier() ? config.classifier_pooling : "last";

  train::ClassifyDataOptions d;
  d.labels = labels;
  d.text_field = a.text_field;
  d.label_field = a.label_field;
  d.template_text = tmpl;
  d.max_tokens = std::min<int64_t>(a.seq, config.max_position_embeddings);
  d.teacher_field = a.teacher_field;
  // Read (and checked, naming FILE:LINE) once: the text trains the tokenizer when none is given.
  const std::vector<train::ClassifyText> texts = train::read_classify_texts(a.data[0], d);
  std::string tokenizer_path = given_tokenizer_path(a, start);
  if (tokenizer_path.empty()) {
    // A BPE of the task's own text: the vocabulary a small-data model can afford.
    const std::string corpus = (fs::path(a.out) / ".bpe_corpus.txt").string();
    {
      fs::create_directories(a.out);
      std::ofstream o(corpus, std::ios::binary | std::ios::trunc);
      for (const auto& t : texts) o << t.text << "\n";
      CORELM_CHECK(o.flush().good(), IOError, corpus, ": cannot write the tokenizer's training text");
    }
    BpeTrainOptions bpe;
    bpe.vocab_size = static_cast<size_t>(config.vocab_size);
    bpe.progress = !a.no_progress;
    const BpeTrainStats s = train_bpe({corpus}, bpe, out_tokenizer);
    fs::remove(corpus);
    if (!a.no_progress)
      std::cerr << "trained a byte-level BPE tokenizer on the task's text: " << s.vocab_size << " tokens -> "
                << out_tokenizer << "\n";
    tokenizer_path = out_tokenizer;
  }
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(tokenizer_path);
  fit_vocab_to_tokenizer(a, start, tokenizer_path, *tok, config);
  std::vector<train::ClassifyRecord> records = train::encode_classify_records(texts, *tok, d);
  std::vector<train::ClassifyRecord> train_records, dev_records;
  if (!a.dev.empty()) {
    train_records = std::move(records);
    train::ClassifyDataOptions dev_options = d;
    dev_options.teacher_field.clear();  // dev records are scored against their labels only
    dev_records = train::load_classify_records(a.dev, *tok, dev_options);
  } else {
    train::stratified_split(records, a.val_fraction_given ? a.val_fraction : 0.1, train_records, dev_records,
                            labels.size());
  }
  const std::vector<int64_t> counts = train::label_counts(train_records, labels.size());
  std::string missing;
  int present = 0;
  for (size_t c = 0; c < labels.size(); ++c) (counts[c] > 0 ? (void)++present : (void)(missing += (missing.empty() ? "" : ",") + labels[c]));
  // One class only: nothing to discriminate, and the dev accuracy that picks the checkpoint would
  // be that class's frequency. Refused rather than trained into a constant.
  CORELM_CHECK(present >= 2, ValueError, "train --task classify: ", a.data[0], " holds training records of only ",
               present, " of the ", labels.size(), " labels (", missing.empty() ? "" : "missing: " + missing,
               "); a classifier needs at least two classes");
  if (!missing.empty())
    std::cerr << "warning: no training records for label(s) " << missing << "; the head will rarely predict them\n";

  config.labels = labels;
  config.classifier_pooling = pooling;
  config.classifier_template = tmpl == "{text}" ? "" : tmpl;
  config.classifier_temperature = 1.0;
  const TokenId pad = tok->pad_id().value_or(tok->eos_id().value_or(0));
  if (config.pad_token_id < 0 && static_cast<int64_t>(pad) < config.vocab_size) config.pad_token_id = pad;
  model::Decoder decoder(config);
  if (init) {
    // A new head (or one over other labels) starts from the initialisation; the body is copied.
    decoder.init_weights(a.seed);
    const bool same_head = init->decoder.config().labels == labels;
    for (const auto& [name, t] : init->decoder.named_parameters())
      if (name != "score.weight" || same_head) decoder.load_parameter(name, t);
    init.reset();
  } else {
    decoder.init_weights(a.seed);
  }

  TrainArgs b = a;
  if (a.epochs > 0)
    b.steps = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.epochs * static_cast<double>(train_records.size()) /
                                                                  static_cast<double>(a.batch * a.grad_accum))));
  train::TrainOptions opt = train_options(b);
  opt.seq = d.max_tokens;
  opt.sample_tokens = 0;
  train::ClassifyTrainOptions co;
  co.label_smoothing = a.label_smoothing;
  co.dropout = a.classifier_dropout;
  co.distill_weight = a.distill_weight;
  // The head's initial weights come from --seed; the batch order and the dropout masks from
  // --data-seed, so fine-tunes that differ only in it start from the same point.
  const uint64_t data_seed = a.data_seed.value_or(a.seed);
  co.seed = data_seed;
  co.train_body = !a.freeze_body;
  co.pad_id = pad;
  train::ClassifyObjective objective(dev_records, co);
  opt.objective = &objective;
  train::ClassifySampler sampler(train_records, labels.size(), a.balance, pad, data_seed);
  if (!a.no_progress)
    std::cerr << "classify: " << train_records.size() << " train / " << dev_records.size() << " dev records, "
              << labels.size() << " labels, " << opt.steps << " steps; model: " << config.num_parameters(true)
              << " parameters\n";
  const train::TrainResult r = train::train(decoder, sampler, nullptr, tok.get(), tokenizer_path, opt);
  const train::ClassifyFinish f = r.stopped_by_signal ? train::ClassifyFinish{}
                                                       : train::finish_classifier(decoder, objective, dev_records, a.out, pad);
  nlohmann::ordered_json summary{{"out", a.out},
                                 {"task", "classify"},
                                 {"labels", labels},
                                 {"start_step", r.start_step},
                                 {"steps", r.end_step},
                                 {"train_loss", r.last_train_loss},
                                 {"train_records", train_records.size()},
                                 {"dev_records", dev_records.size()},
                                 {"best_step", f.best_step},
                                 {"dev_accuracy", f.dev_accuracy},
                                 {"dev_loss", f.dev_loss},
                                 {"temperature", f.temperature},
                                 {"ece_before", f.ece_before},
                                 {"ece_after", f.ece_after},
                                 {"params", config.num_parameters(true)},
                                 {"tokens_per_s", r.tokens_per_s},
                                 {"threads", a.threads},
                                 {"checkpoint", r.checkpoint}};
  if (!a.teacher_field.empty()) {
    summary["teacher_field"] = a.teacher_field;
    summary["distill_weight"] = a.distill_weight;
  }
  if (a.data_seed) summary["data_seed"] = *a.data_seed;
  if (r.stopped_by_signal) summary["stopped_by_signal"] = r.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM";
  std::cout << summary.dump() << "\n";
  return r.stopped_by_signal ? 128 + r.stopped_by_signal : 0;
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
  c->add_option("--preset", a->preset, "model shape: tiny, small, smollm2-135m, hybrid (docs/HYBRID.md)")->capture_default_str();
  c->add_option("--config", a->config, "a config.json instead of a preset");
  c->add_option("--init", a->init, "start from this model directory (fine-tuning)");
  c->add_option("--data", a->data, "text files (tokenized on the fly) or token files FILE.bin (+ FILE.bin.json)");
  c->add_option("--sft", a->sft, "supervised fine-tuning pairs: JSONL {\"input\": ..., \"output\": ...}");
  c->add_option("--tokenizer", a->tokenizer, "tokenizer to use (default: train a byte-level BPE on the data)");
  c->add_option("--out", a->out,
                "output directory: a model directory of the latest checkpoint, checkpoints/, train_log.jsonl")
      ->required();
  c->add_option("--steps", a->steps, "optimizer steps (required, except with --task classify --epochs)");
  c->add_option("--threads", a->threads, "threads")->capture_default_str();
  c->add_option("--seed", a->seed, "seed for weights and data order")->capture_default_str();
  c->add_option("--data-seed", a->data_seed,
                "classify: seed of the batch order (and dropout masks) alone; the new head's weights keep "
                "--seed (default: --seed)");
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
  c->add_option("--decay-fraction", a->decay_fraction,
                "wsd: the last fraction of --steps, decayed linearly to lr * min-lr-ratio (the peak holds before it)")
      ->capture_default_str();
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
  // --task classify: the classification head (docs/TRAINING.md, "Classification head").
  c->add_option("--task", a->task, "lm (next-token prediction; --sft pairs) or classify (the classification head)")
      ->check(CLI::IsMember({"lm", "classify"}))
      ->capture_default_str();
  c->add_option("--labels", a->labels, "classify: the classes, comma-separated (the head's order)")->delimiter(',');
  c->add_option("--text-field", a->text_field, "classify: the records' text field")->capture_default_str();
  c->add_option("--label-field", a->label_field, "classify: the records' label field")->capture_default_str();
  c->add_option("--template", a->template_text, "classify: prompt template holding {text} (\\n allowed)")
      ->capture_default_str();
  c->add_option("--dev", a->dev, "classify: dev records (default: a stratified --val-fraction of --data)");
  c->add_option("--epochs", a->epochs, "classify: passes over the training records (instead of --steps)");
  c->add_option("--label-smoothing", a->label_smoothing, "classify: label smoothing of the cross-entropy")
      ->capture_default_str();
  c->add_option("--classifier-dropout", a->classifier_dropout,
                "classify: dropout on the pooled state before the head while training (0: none)")
      ->capture_default_str();
  CLI::Option* teacher = c->add_option("--teacher-field", a->teacher_field,
                "classify: distil from a teacher: the records' field holding its probability of each label "
                "({label: p}, as `run classify` writes \"probs\", or an array in label order)");
  c->add_option("--distill-weight", a->distill_weight,
                "classify with --teacher-field: weight w of the teacher's soft targets; the loss is "
                "(1 - w) * CE(labels) + w * CE(teacher)")
      ->capture_default_str()
      ->needs(teacher);  // a weight without a teacher would be ignored without a word
  c->add_flag("--balance", a->balance, "classify: class-balanced sampling (a uniform class, then a record of it)");
  c->add_flag("--freeze-body", a->freeze_body, "classify: train only the head (score.weight)");
  c->add_option("--pooling", a->pooling, "classify: last (HF: the last token's hidden state) or mean")
      ->check(CLI::IsMember({"last", "mean"}));
  CLI::Option* val_fraction = c->get_option("--val-fraction");
  c->callback([a, warmup, eval_every, val_fraction] {
    a->val_fraction_given = val_fraction->count() > 0;
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
