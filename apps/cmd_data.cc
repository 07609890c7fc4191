// corelm data build: text files -> deduplicated, filtered paragraphs -> train/val token files.
// Argument parsing and printing only; the build lives in src/pipeline/corpus_build.cc.
#include <cstdio>
#include <iostream>
#include <memory>

#include "command_registry.h"
#include "corelm/corpus_build.h"
#include "corelm/error.h"
#include "corelm/thread_pool.h"

namespace corelm::cli {
namespace {

struct DataBuildArgs {
  pipeline::CorpusBuildOptions opt;
  int threads = 1;
  int64_t sample_mb = 32;
  bool json = false, no_progress = false, no_near_dedup = false;
};

void run(DataBuildArgs& a) {
  set_num_threads(a.threads);
  a.opt.tokenizer_sample_bytes = a.sample_mb << 20;
  a.opt.near_dedup = !a.no_near_dedup;
  a.opt.progress = !a.no_progress;
  const pipeline::CorpusBuildReport r = pipeline::build_corpus(a.opt);
  if (a.json) {
    std::cout << r.to_json().dump() << "\n";
    return;
  }
  std::printf("files %lld (%lld skipped as binary, %lld empty), %.1f MB read\n", static_cast<long long>(r.files),
              static_cast<long long>(r.files_skipped_binary), static_cast<long long>(r.files_empty), r.bytes / 1048576.0);
  std::printf("paragraphs in %lld, kept %lld (%.1f MB): train %lld, val %lld\n", static_cast<long long>(r.paragraphs_in),
              static_cast<long long>(r.paragraphs_kept), r.kept_bytes / 1048576.0,
              static_cast<long long>(r.paragraphs_train), static_cast<long long>(r.paragraphs_val));
  std::printf("dropped:");
  const nlohmann::ordered_json report = r.to_json();
  for (const auto& [rule, n] : report["dropped"].items()) std::printf(" %s %lld", rule.c_str(), n.get<long long>());
  std::printf("\ntokens: train %llu -> %s, val %llu -> %s\n", static_cast<unsigned long long>(r.train_tokens),
              r.output.c_str(), static_cast<unsigned long long>(r.val_tokens),
              r.val_output.empty() ? "(none)" : r.val_output.c_str());
  std::printf("tokenizer %s (%s, %lld tokens)\n", r.tokenizer.c_str(), r.tokenizer_trained ? "trained" : "given",
              static_cast<long long>(r.vocab_size));
  std::printf("%.1f s (filter %.1f s, tokenize %.1f s at %.0f tok/s, %d threads)\n", r.seconds, r.filter_seconds,
              r.tokenize_seconds, r.tokens_per_s, r.threads);
  if (!r.val_output.empty())
    std::printf("train with: corelm train --data %s %s --val-fraction %.9g --tokenizer %s ...\n", r.output.c_str(),
                r.val_output.c_str(), r.train_val_fraction(), r.tokenizer.c_str());
}

RegisterCommand reg([](CLI::App& root) {
  CLI::App& data = subcommand_group(root, "data", "Build training data");
  auto a = std::make_shared<DataBuildArgs>();
  pipeline::CorpusBuildOptions& o = a->opt;
  pipeline::QualityThresholds& q = o.quality;
  CLI::App* c = data.add_subcommand(
      "build", "Text files -> deduplicated, quality-filtered paragraphs -> train/val token files for corelm train");
  c->add_option("--from", o.inputs, "text files or folders (recursive, sorted); .gz and .zst read transparently")
      ->required();
  c->add_option("--out", o.output, "training token file, e.g. corpus.bin (+ corpus.bin.json, corpus.val.bin)")
      ->required();
  c->add_option("--tokenizer", o.tokenizer, "tokenizer file or folder (default: train a byte-level BPE)");
  c->add_option("--vocab-size", o.vocab_size, "vocabulary of the BPE trained without --tokenizer")->capture_default_str();
  c->add_option("--tokenizer-sample-mb", a->sample_mb, "MB of kept training text the BPE is trained on")
      ->capture_default_str();
  c->add_option("--val-fraction", o.val_fraction, "share of paragraphs (by hash) in the validation file, [0, 0.5]")
      ->capture_default_str();
  c->add_option("--min-chars", q.min_chars, "drop paragraphs shorter than this (characters)")->capture_default_str();
  c->add_option("--near-dup-threshold", o.near_dup_threshold, "word 5-gram Jaccard at which a paragraph is a near duplicate")
      ->capture_default_str();
  c->add_flag("--no-near-dedup", a->no_near_dedup, "keep near duplicates (exact duplicates are still dropped)");
  c->add_option("--min-letter-ratio", q.min_letter_ratio, "ASCII letters / non-space characters at least")
      ->capture_default_str();
  c->add_option("--max-symbol-ratio", q.max_symbol_ratio, "symbols (#$%&*<=>@[\\]^_`{|}~) / non-space characters at most")
      ->capture_default_str();
  c->add_option("--min-mean-word", q.min_mean_word, "mean word length at least")->capture_default_str();
  c->add_option("--max-mean-word", q.max_mean_word, "mean word length at most")->capture_default_str();
  c->add_option("--min-stopword-ratio", q.min_stopword_ratio, "share of words that are common English words at least")
      ->capture_default_str();
  c->add_option("--min-line-end-ratio", q.min_line_end_ratio, "share of lines ending or wrapping a sentence at least")
      ->capture_default_str();
  c->add_option("--max-repeated-line-ratio", q.max_repeated_line_ratio, "share of repeated lines at most")
      ->capture_default_str();
  c->add_option("--max-paragraph-bytes", o.max_paragraph_bytes, "longer paragraphs are cut at a line boundary")
      ->capture_default_str();
  c->add_option("--dropped-log", o.dropped_log, "write each dropped paragraph as a JSON line {rule, file, text} here");
  c->add_flag("--keep-lines", o.keep_lines, "keep line breaks inside paragraphs (default: join lines with a space)");
  c->add_option("--threads", a->threads, "threads for filtering and tokenizing")->capture_default_str();
  c->add_flag("--json", a->json, "print the report as one JSON line");
  c->add_flag("--no-progress", a->no_progress, "no progress line on stderr");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace corelm::cli
