// Pretraining data from plain text (`corelm data build`): text files (plain, .gz, .zst; folders
// recursively, in sorted order) -> paragraphs (blank-line separated) -> whitespace normalised ->
// exact duplicates, near duplicates and low-quality / non-English paragraphs dropped by the
// documented rules below -> a train/val split by paragraph hash -> token files in the format
// `corelm tokenize --output` writes and `corelm train --data` reads (raw little-endian ids plus a
// JSON sidecar). Everything is deterministic: the same inputs and options give the same bytes,
// whatever the thread count.
//
// The rules, in the order they are applied (the first that fires is the one counted):
//   invalid_utf8     the paragraph is not valid UTF-8
//   too_short        fewer than min_chars characters (code points) after normalisation
//   exact_duplicate  the 64-bit hash of the normalised paragraph was seen before
//   letters          ASCII letters / non-space characters < min_letter_ratio (0.70): numbers,
//                    tables, code, non-Latin scripts
//   symbols          symbol characters (# $ % & * < = > @ [ \ ] ^ _ ` { | } ~) / non-space
//                    characters > max_symbol_ratio (0.05): markup and code
//   word_length      mean word length (letters of each space-separated word, punctuation
//                    stripped) outside [min_mean_word, max_mean_word] = [3, 10]: lists of
//                    initials, base64, URLs
//   stopwords        fraction of words that are among 52 of the most common English words (the,
//                    of, and, to, a, in, is, ...) < min_stopword_ratio (0.10): other languages
//                    (German or French prose scores below 0.06), keyword lists, option tables
//   line_ends        no sentence end (. ! ? before a space or a line end) at all, or, in a
//                    paragraph of 3 or more lines, the fraction of lines that end a sentence or
//                    wrap inside one < min_line_end_ratio (0.5); a line counts when it ends in
//                    . ! ? : ; , ) ] " ' (or a closing curly quote) or the next line starts with a
//                    lower-case letter: menus, headings, listings, tables of contents
//   repeated_lines   fraction of the paragraph's lines that repeat an earlier line of it >
//                    max_repeated_line_ratio (0.3): boilerplate, tables
//   near_duplicate   Jaccard similarity >= near_dup_threshold (0.8) with an earlier kept
//                    paragraph, over the sets of word 5-gram shingles (words: lower-cased runs of
//                    letters and digits); candidates come from MinHash with LSH banding (10 bands
//                    of 5 rows: a pair at Jaccard 0.8 becomes a candidate with probability 0.98,
//                    at 0.5 with 0.27), and each candidate's Jaccard is computed exactly from both
//                    texts, so nothing below the threshold is ever dropped. Only the first kept
//                    paragraph of each band bucket is compared, so a near duplicate whose every
//                    band collides with other paragraphs first can be missed (rare).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace corelm::pipeline {

struct QualityThresholds {
  int64_t min_chars = 80;
  double min_letter_ratio = 0.70;
  double max_symbol_ratio = 0.05;
  double min_mean_word = 3, max_mean_word = 10;
  double min_stopword_ratio = 0.10;
  double min_line_end_ratio = 0.5;
  double max_repeated_line_ratio = 0.3;
};

struct CorpusBuildOptions {
  std::vector<std::string> inputs;  // files and folders (recursively; files in sorted path order)
  std::string output;               // the training token file, e.g. corpus.bin (+ corpus.bin.json)
  // Tokenizer: a tokenizer file or folder; empty: a byte-level BPE of `vocab_size` tokens is
  // trained on a sample of the kept training paragraphs (about tokenizer_sample_bytes, chosen by
  // paragraph hash) and written as tokenizer_path(output).
  std::string tokenizer;
  int64_t vocab_size = 16384;
  int64_t tokenizer_sample_bytes = int64_t(32) << 20;
  double val_fraction = 0.01;       // in [0, 0.5]; 0: no validation file
  double near_dup_threshold = 0.8;  // in (0, 1]; 1: only identical shingle sets
  bool near_dedup = true;
  bool keep_lines = false;          // keep line breaks inside paragraphs (default: join with a space)
  int64_t max_paragraph_bytes = 65536;  // longer paragraphs are cut at a line (or space) boundary
  QualityThresholds quality;
  bool progress = false;            // a progress line with ETA on stderr
  // When set, every dropped paragraph is written there as a JSON line {"rule", "file", "text"}
  // (the first 2,000 bytes of its text), to check what the thresholds remove.
  std::string dropped_log;
  // ValueError naming the CLI option of the first value out of range.
  void validate() const;
};

// Names of the files a build writes beside `output`: "corpus.bin" -> "corpus.val.bin" and
// "corpus.tokenizer.json" ("data" -> "data.val.bin", "data.tokenizer.json").
std::string val_path(const std::string& output);
std::string tokenizer_path(const std::string& output);

struct CorpusBuildReport {
  int64_t files = 0, files_skipped_binary = 0, files_empty = 0;
  uint64_t bytes = 0;  // decompressed bytes read
  int64_t paragraphs_in = 0, paragraphs_kept = 0, paragraphs_train = 0, paragraphs_val = 0;
  std::map<std::string, int64_t> dropped;  // rule name (see above) -> paragraphs
  uint64_t kept_bytes = 0, train_tokens = 0, val_tokens = 0;
  std::string output, val_output, tokenizer;  // val_output empty with val_fraction 0
  bool tokenizer_trained = false;
  int64_t vocab_size = 0;
  double filter_seconds = 0, tokenize_seconds = 0, seconds = 0, tokens_per_s = 0;
  int threads = 1;
  // `corelm train` reads several token files as one and validates on the last --val-fraction of
  // the tokens: with `--data OUTPUT VAL_OUTPUT --val-fraction train_val_fraction` the validation
  // split is exactly VAL_OUTPUT's tokens.
  double train_val_fraction() const;
  nlohmann::ordered_json to_json() const;
};

// Builds the corpus. Every output file is written under a temp name and renamed into place only
// once all of them are complete, so a failed build (bad input, full disk) leaves the previous
// files (or none), never a partial one. Temp files a killed build left beside the output (their
// writer's pid is dead) are removed at the start. Errors: IOError/FormatError naming the file (and byte
// offset for damaged .gz/.zst), ValueError for bad options or when nothing is left to write.
// Uses the process thread pool (set_num_threads) for filtering and tokenization.
CorpusBuildReport build_corpus(const CorpusBuildOptions& options);

// ---- the pieces, for tests and the fuzzer ----

// Streams text into paragraphs: runs of lines separated by blank (whitespace-only) lines. '\r'
// before '\n' is dropped. A paragraph reaching max_bytes ends at that line; a single line longer
// than max_bytes is cut at its last space before the limit (else at a UTF-8 boundary).
class ParagraphSplitter {
 public:
  using Sink = std::function<void(std::string&& paragraph)>;  // raw lines joined by '\n'
  ParagraphSplitter(int64_t max_bytes, Sink sink) : max_(max_bytes), sink_(std::move(sink)) {}
  void feed(std::string_view bytes);
  void finish();

 private:
  void line(std::string_view l);
  void flush();
  int64_t max_;
  Sink sink_;
  std::string pending_line_, para_;
};

// A paragraph's lines with whitespace runs (space, tab, \f, \v) collapsed to one space, ends
// trimmed, other ASCII control characters removed, empty lines dropped.
std::vector<std::string> normalized_lines(std::string_view raw);
// The lines joined with ' ' (or '\n' with keep_lines).
std::string join_lines(const std::vector<std::string>& lines, bool keep_lines);

// The first quality rule (letters ... repeated_lines) that drops the paragraph, or "" to keep it.
// min_chars, UTF-8 and duplicates are checked by the builder.
std::string quality_verdict(const std::vector<std::string>& lines, const QualityThresholds& t);

// Sorted, unique 64-bit hashes of the word 5-gram shingles (a text of fewer than 5 words is one
// shingle of all its words; no words: empty).
std::vector<uint64_t> shingles(std::string_view text);
double jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);
uint64_t paragraph_hash(std::string_view text);

}  // namespace corelm::pipeline
