// `corelm data build`: files -> kept paragraphs (spilled to an unlinked temp file beside the
// output, so memory holds only hashes and offsets) -> optional BPE training on a sample -> token
// files. Paragraphs are analysed in parallel batches; the decisions that depend on earlier
// paragraphs (duplicates) are taken in input order on one thread, so the result never depends on
// the thread count.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "corelm/corpus_build.h"
#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"
#include "corelm/utf8.h"
#include "pipeline/corpus_hash.h"
#include "pipeline/input.h"

namespace corelm::pipeline {
namespace fs = std::filesystem;
namespace {

// The rules in the order they are applied (and reported).
constexpr const char* kRules[] = {"invalid_utf8", "too_short",  "exact_duplicate", "letters",        "symbols",
                                  "word_length",  "stopwords",  "line_ends",       "repeated_lines", "near_duplicate"};
constexpr uint64_t kSplitSalt = 0x51ab1e5eedull, kSampleSalt = 0xb9e5a3c1d7ull;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string strip_bin(const std::string& output) {
  return output.size() > 4 && output.ends_with(".bin") ? output.substr(0, output.size() - 4) : output;
}

// One progress line on stderr: rewritten in place on a terminal, else one line every 10 s.
class Progress {
 public:
  explicit Progress(bool on) : on_(on), tty_(on && ::isatty(2)), start_(now_s()), last_(start_) {}
  void update(const char* phase, double fraction, const std::string& detail, bool force = false) {
    if (!on_) return;
    const double t = now_s();
    if (phase != phase_) {  // the ETA of each phase is from its own start
      phase_ = phase;
      start_ = t;
    }
    if (!force && t - last_ < (tty_ ? 0.5 : 10.0)) return;
    last_ = t;
    const double el = t - start_;
    std::string eta = "?";
    if (fraction > 0.001) eta = format_s(el * (1 - fraction) / fraction);
    std::fprintf(stderr, "%s[data build] %s %5.1f%%  %s  elapsed %s  ETA %s%s", tty_ ? "\r" : "", phase,
                 100 * std::min(1.0, fraction), detail.c_str(), format_s(el).c_str(), eta.c_str(), tty_ ? "   " : "\n");
    std::fflush(stderr);
    dirty_ = tty_;
  }
  void end_line() {
    if (dirty_) std::fputc('\n', stderr);
    dirty_ = false;
  }

 private:
  static std::string format_s(double s) {
    char b[32];
    if (s < 60) std::snprintf(b, sizeof b, "%.0fs", s);
    else std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
    return b;
  }
  bool on_, tty_, dirty_ = false;
  double start_, last_;
  std::string phase_;
};

// The kept paragraphs' normalised text, in an unlinked file beside the output (gone even after
// kill -9): appended in input order, read back by offset.
class Spill {
 public:
  explicit Spill(const std::string& output) : path_(unique_sibling(output, "spill")) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    CORELM_CHECK(fd_ >= 0, IOError, path_, ": cannot create the build's temp file: ", std::strerror(errno));
    ::unlink(path_.c_str());
  }
  ~Spill() { ::close(fd_); }
  uint64_t append(std::string_view s) {
    const uint64_t at = size_;
    for (size_t done = 0; done < s.size();) {
      const ssize_t w = ::pwrite(fd_, s.data() + done, s.size() - done, static_cast<off_t>(size_ + done));
      if (w < 0 && errno == EINTR) continue;
      CORELM_CHECK(w > 0, IOError, path_, ": write failed: ", std::strerror(errno));
      done += static_cast<size_t>(w);
    }
    size_ += s.size();
    return at;
  }
  std::string read(uint64_t offset, uint32_t length) const {
    std::string s(length, '\0');
    for (size_t done = 0; done < length;) {
      const ssize_t r = ::pread(fd_, s.data() + done, length - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      CORELM_CHECK(r > 0, IOError, path_, ": read failed: ", std::strerror(errno));
      done += static_cast<size_t>(r);
    }
    return s;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct Kept {
  uint64_t offset = 0;
  uint32_t length = 0;
  uint64_t hash = 0;
  bool val = false;
};

// What the parallel stage finds out about one paragraph.
struct Analysis {
  std::string text;     // normalised
  std::string verdict;  // "" or the rule that drops it
  uint64_t hash = 0;
  std::vector<uint64_t> shingles;
  BandKeys bands{};
};

std::vector<std::string> list_files(const std::vector<std::string>& inputs) {
  CORELM_CHECK(!inputs.empty(), ValueError, "data build: --from: no inputs given");
  std::vector<std::string> files;
  std::set<std::string> seen;  // canonical paths
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    CORELM_CHECK(!ec && fs::exists(st), IOError, "--from ", in, ": ",
                 ec ? ec.message() : std::string("No such file or directory"));
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      try {
        for (const auto& e : fs::recursive_directory_iterator(in))
          if (e.is_regular_file()) found.push_back(e.path().string());  // FIFOs, sockets, dangling links: skipped
      } catch (const fs::filesystem_error& e) {
        throw IOError("--from " + in + ": cannot list " + e.path1().string() + ": " + e.code().message());
      }
      std::sort(found.begin(), found.end());
      // A file reached twice through links or overlapping folders is read once.
      for (const std::string& f : found)
        if (seen.insert(fs::weakly_canonical(f).string()).second) files.push_back(f);
    } else {
      CORELM_CHECK(fs::is_regular_file(st), IOError, "--from ", in, ": not a regular file or a folder");
      CORELM_CHECK(seen.insert(fs::weakly_canonical(in).string()).second, ValueError, "--from: ", in,
                   " is given twice (directly or through a folder)");
      files.push_back(in);
    }
  }
  return files;
}

int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The token file sidecar `corelm tokenize` writes, plus where the file came from.
std::string sidecar(const Tokenizer& tok, const std::string& tokenizer_text, int dtype_bytes, uint64_t tokens,
                    int64_t paragraphs, const char* split, const CorpusBuildReport& report) {
  nlohmann::ordered_json meta;
  meta["format"] = "corelm token file: raw little-endian ids, no header";
  meta["dtype"] = dtype_bytes == 2 ? "uint16" : "uint32";
  meta["tokens"] = tokens;
  meta["documents"] = paragraphs;
  meta["vocab_size"] = tok.vocab_size();
  meta["tokenizer"] = tokenizer_text;
  if (tok.eos_id()) meta["eos_id"] = *tok.eos_id();
  if (tok.bos_id()) meta["bos_id"] = *tok.bos_id();
  meta["split"] = split;
  meta["data_build"] = report.to_json();
  return meta.dump(1) + "\n";
}

void write_ids(AtomicWriter& w, const std::vector<TokenId>& ids, int dtype_bytes, std::vector<char>& buf) {
  buf.resize(ids.size() * static_cast<size_t>(dtype_bytes));
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t v = static_cast<uint32_t>(ids[i]);
    if (dtype_bytes == 2) {
      const uint16_t h = static_cast<uint16_t>(v);
      std::memcpy(&buf[i * 2], &h, 2);  // little-endian hosts (x86-64, arm64), as corelm tokenize
    } else {
      std::memcpy(&buf[i * 4], &v, 4);
    }
  }
  w.write(buf.data(), buf.size());
}

// Removes a temp file when it goes out of scope.
struct TempFile {
  std::string path;
  ~TempFile() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

// Temp files of earlier builds of the same output whose writer is dead (killed with -9 or by a
// power cut: an error path removes its own). Their names are those AtomicWriter and
// unique_sibling give: "<name>.tmp.<pid>.<n>" and ".<name>.<tag>.<pid>.<n>..." beside the output.
void remove_dead_temp_files(const std::string& output, const std::vector<std::string>& names) {
  const fs::path dir = fs::path(output).parent_path().empty() ? fs::path(".") : fs::path(output).parent_path();
  std::vector<std::string> prefixes;
  for (const std::string& n : names)
    for (const std::string& p : {n + ".tmp.", n + ".json.tmp.", "." + n + ".tmp.", "." + n + ".bpe-sample.",
                                 "." + n + ".spill.", ".." + n + ".bpe-sample."})
      prefixes.push_back(p);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const std::string& p : prefixes) {
      const long pid = temp_writer_pid(name, p);
      if (pid > 0 && !process_alive(pid)) {
        fs::remove(e.path(), ec);
        break;
      }
    }
  }
}

}  // namespace

void CorpusBuildOptions::validate() const {
  CORELM_CHECK(!output.empty(), ValueError, "data build: --out is required");
  CORELM_CHECK(std::isfinite(val_fraction) && val_fraction >= 0 && val_fraction <= 0.5, ValueError,
               "data build: --val-fraction must be in [0, 0.5] (0: no validation file), got ", val_fraction);
  CORELM_CHECK(std::isfinite(near_dup_threshold) && near_dup_threshold > 0 && near_dup_threshold <= 1, ValueError,
               "data build: --near-dup-threshold must be in (0, 1], got ", near_dup_threshold);
  CORELM_CHECK(tokenizer.empty() ? vocab_size >= 257 && vocab_size <= (int64_t(1) << 20) : true, ValueError,
               "data build: --vocab-size must be in [257, 1048576] (256 bytes + merges + <|endoftext|>), got ",
               vocab_size);
  CORELM_CHECK(tokenizer_sample_bytes >= 1024, ValueError, "data build: --tokenizer-sample-mb must be positive");
  CORELM_CHECK(max_paragraph_bytes >= 256 && max_paragraph_bytes <= (int64_t(1) << 30), ValueError,
               "data build: --max-paragraph-bytes must be in [256, 2^30], got ", max_paragraph_bytes);
  const QualityThresholds& q = quality;
  CORELM_CHECK(q.min_chars >= 0, ValueError, "data build: --min-chars must be >= 0, got ", q.min_chars);
  auto ratio = [](double v, const char* opt) {
    CORELM_CHECK(std::isfinite(v) && v >= 0 && v <= 1, ValueError, "data build: ", opt, " must be in [0, 1], got ", v);
  };
  ratio(q.min_letter_ratio, "--min-letter-ratio");
  ratio(q.max_symbol_ratio, "--max-symbol-ratio");
  ratio(q.min_stopword_ratio, "--min-stopword-ratio");
  ratio(q.min_line_end_ratio, "--min-line-end-ratio");
  ratio(q.max_repeated_line_ratio, "--max-repeated-line-ratio");
  CORELM_CHECK(std::isfinite(q.min_mean_word) && std::isfinite(q.max_mean_word) && q.min_mean_word >= 0 &&
                   q.min_mean_word <= q.max_mean_word,
               ValueError, "data build: the mean word length range must satisfy 0 <= min <= max, got [",
               q.min_mean_word, ", ", q.max_mean_word, "]");
}

std::string val_path(const std::string& output) { return strip_bin(output) + ".val.bin"; }
std::string tokenizer_path(const std::string& output) { return strip_bin(output) + ".tokenizer.json"; }

double CorpusBuildReport::train_val_fraction() const {
  const double total = static_cast<double>(train_tokens + val_tokens);
  if (val_tokens == 0 || total == 0) return 0;
  // corelm train keeps floor(total * fraction) tokens for validation: half a token of margin
  // makes that exactly val_tokens.
  return (static_cast<double>(val_tokens) + 0.5) / total;
}

nlohmann::ordered_json CorpusBuildReport::to_json() const {
  nlohmann::ordered_json j;
  j["files"] = files;
  j["files_skipped_binary"] = files_skipped_binary;
  j["files_empty"] = files_empty;
  j["bytes"] = bytes;
  j["paragraphs_in"] = paragraphs_in;
  j["paragraphs_kept"] = paragraphs_kept;
  j["paragraphs_train"] = paragraphs_train;
  j["paragraphs_val"] = paragraphs_val;
  nlohmann::ordered_json d = nlohmann::ordered_json::object();
  for (const char* rule : kRules) {
    auto it = dropped.find(rule);
    d[rule] = it == dropped.end() ? 0 : it->second;
  }
  j["dropped"] = d;
  j["kept_bytes"] = kept_bytes;
  j["train_tokens"] = train_tokens;
  j["val_tokens"] = val_tokens;
  j["output"] = output;
  j["val_output"] = val_output.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(val_output);
  j["train_val_fraction"] = train_val_fraction();
  j["tokenizer"] = tokenizer;
  j["tokenizer_trained"] = tokenizer_trained;
  j["vocab_size"] = vocab_size;
  j["threads"] = threads;
  j["filter_seconds"] = filter_seconds;
  j["tokenize_seconds"] = tokenize_seconds;
  j["seconds"] = seconds;
  j["tokens_per_s"] = tokens_per_s;
  return j;
}

CorpusBuildReport build_corpus(const CorpusBuildOptions& o) {
  o.validate();
  const double t0 = now_s();
  CorpusBuildReport rep;
  rep.threads = num_threads();
  rep.output = o.output;
  for (const char* rule : kRules) rep.dropped[rule] = 0;
  const std::vector<std::string> files = list_files(o.inputs);
  if (!o.tokenizer.empty()) {
    std::error_code ec;
    CORELM_CHECK(fs::exists(o.tokenizer, ec), IOError, "--tokenizer ", o.tokenizer, ": No such file or directory");
  }
  {
    const fs::path parent = fs::path(o.output).parent_path();
    std::error_code ec;
    CORELM_CHECK(parent.empty() || fs::is_directory(parent, ec), IOError, "--out ", o.output, ": folder ",
                 parent.string(), " does not exist");
  }
  remove_dead_temp_files(o.output, {fs::path(o.output).filename().string(), fs::path(val_path(o.output)).filename().string(),
                                    fs::path(tokenizer_path(o.output)).filename().string()});
  uint64_t disk_total = 0, disk_done = 0;
  std::vector<uint64_t> disk_size(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    disk_size[i] = fs::file_size(files[i], ec);
    disk_total += ec ? 0 : disk_size[i];
  }

  Progress progress(o.progress);
  Spill spill(o.output);
  std::vector<Kept> kept;
  U64Set exact;
  std::vector<BandTable> bands(o.near_dedup ? kBands : 0);
  std::unique_ptr<AtomicWriter> dropped_log = o.dropped_log.empty() ? nullptr : std::make_unique<AtomicWriter>(o.dropped_log);
  std::vector<std::string> batch_file;  // the input file of each paragraph in the batch (for the log)
  auto drop = [&](const std::string& rule, size_t i, const std::string& text) {
    ++rep.dropped[rule];
    if (!dropped_log) return;
    nlohmann::json j{{"rule", rule}, {"file", escape_invalid_utf8(batch_file[i])},
                     {"text", escape_invalid_utf8(text.substr(0, std::min<size_t>(text.size(), 2000)))}};
    dropped_log->write(j.dump() + "\n");
  };

  // ---- stage 1: paragraphs -> decisions ----
  std::vector<std::string> batch;
  size_t batch_bytes = 0;
  std::vector<Analysis> an;
  auto process_batch = [&] {
    if (batch.empty()) return;
    an.assign(batch.size(), Analysis{});
    parallel_for(static_cast<int64_t>(batch.size()), 16, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        Analysis& a = an[i];
        if (!valid_utf8(batch[i])) {
          a.verdict = "invalid_utf8";
          continue;
        }
        const std::vector<std::string> lines = normalized_lines(batch[i]);
        a.text = join_lines(lines, o.keep_lines);
        if (code_points(a.text) < o.quality.min_chars || a.text.empty()) {
          a.verdict = "too_short";
          continue;
        }
        a.hash = paragraph_hash(a.text);
        a.verdict = quality_verdict(lines, o.quality);
        if (a.verdict.empty() && o.near_dedup) {
          a.shingles = shingles(a.text);
          a.bands = band_keys(a.shingles);
        }
      }
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      Analysis& a = an[i];
      ++rep.paragraphs_in;
      if (a.verdict == "invalid_utf8" || a.verdict == "too_short") {
        drop(a.verdict, i, a.text.empty() ? batch[i] : a.text);
        continue;
      }
      if (!exact.insert(a.hash)) {
        drop("exact_duplicate", i, a.text);
        continue;
      }
      if (!a.verdict.empty()) {
        drop(a.verdict, i, a.text);
        continue;
      }
      if (o.near_dedup) {
        bool dup = false;
        int64_t tried[kBands];
        int n_tried = 0;
        for (int b = 0; b < kBands && !dup; ++b) {
          const int64_t c = bands[b].find(a.bands[b]);
          if (c < 0 || std::find(tried, tried + n_tried, c) != tried + n_tried) continue;
          tried[n_tried++] = c;
          const Kept& k = kept[static_cast<size_t>(c)];
          dup = jaccard(a.shingles, shingles(spill.read(k.offset, k.length))) >= o.near_dup_threshold;
        }
        if (dup) {
          drop("near_duplicate", i, a.text);
          continue;
        }
        CORELM_CHECK(kept.size() < 0xfffffffeu, ValueError, "data build: more than 4e9 kept paragraphs");
        for (int b = 0; b < kBands; ++b) bands[b].insert_if_absent(a.bands[b], static_cast<uint32_t>(kept.size()));
      }
      Kept k;
      k.offset = spill.append(a.text);
      k.length = static_cast<uint32_t>(a.text.size());
      k.hash = a.hash;
      k.val = o.val_fraction > 0 && unit_interval(a.hash, kSplitSalt) < o.val_fraction;
      kept.push_back(k);
      rep.kept_bytes += a.text.size();
    }
    batch.clear();
    batch_file.clear();
    batch_bytes = 0;
  };
  const std::string* current_file = nullptr;
  ParagraphSplitter splitter(o.max_paragraph_bytes, [&](std::string&& p) {
    batch_bytes += p.size();
    batch.push_back(std::move(p));
    if (dropped_log) batch_file.push_back(*current_file);
    if (batch.size() >= 8192 || batch_bytes >= (size_t(16) << 20)) process_batch();
  });
  std::vector<char> buf(size_t(1) << 20);
  for (size_t f = 0; f < files.size(); ++f) {
    std::unique_ptr<ByteSource> src = ByteSource::open(files[f]);
    current_file = &files[f];
    uint64_t file_bytes = 0;
    bool binary = false;
    for (;;) {
      const size_t got = src->read(buf.data(), buf.size());
      if (got == 0) break;
      // A NUL in the first 64 KiB: not text (images, archives, compiled files).
      if (file_bytes == 0 && std::memchr(buf.data(), '\0', std::min<size_t>(got, 65536)) != nullptr) {
        binary = true;
        break;
      }
      file_bytes += got;
      splitter.feed(std::string_view(buf.data(), got));
    }
    splitter.finish();  // paragraphs never span files
    if (binary) {
      ++rep.files_skipped_binary;
    } else {
      ++rep.files;
      rep.files_empty += file_bytes == 0;
    }
    rep.bytes += file_bytes;
    disk_done += disk_size[f];
    progress.update("filter", disk_total ? static_cast<double>(disk_done) / disk_total : 1,
                    "files " + std::to_string(f + 1) + "/" + std::to_string(files.size()) + "  " +
                        std::to_string(rep.bytes >> 20) + " MB  kept " + std::to_string(kept.size()) + " paragraphs");
  }
  process_batch();
  progress.end_line();
  rep.paragraphs_kept = static_cast<int64_t>(kept.size());
  rep.filter_seconds = now_s() - t0;
  CORELM_CHECK(rep.bytes > 0, ValueError, "data build: the inputs hold no text (", files.size(), " files, ",
               rep.files_skipped_binary, " skipped as binary, ", rep.files_empty, " empty)");
  CORELM_CHECK(!kept.empty(), ValueError, "data build: every one of the ", rep.paragraphs_in,
               " paragraphs was dropped by the filters (", nlohmann::json(rep.dropped).dump(),
               "); check the inputs are English prose or relax the thresholds");

  // The split: by hash, with at least one paragraph on each side when both are asked for.
  if (o.val_fraction > 0 && kept.size() >= 2) {
    auto key = [](const Kept& k) { return unit_interval(k.hash, kSplitSalt); };
    const bool any_val = std::any_of(kept.begin(), kept.end(), [](const Kept& k) { return k.val; });
    const bool any_train = std::any_of(kept.begin(), kept.end(), [](const Kept& k) { return !k.val; });
    if (!any_val)
      std::min_element(kept.begin(), kept.end(), [&](const Kept& a, const Kept& b) { return key(a) < key(b); })->val = true;
    if (!any_train)
      std::max_element(kept.begin(), kept.end(), [&](const Kept& a, const Kept& b) { return key(a) < key(b); })->val = false;
  }
  std::vector<uint32_t> train_ids, val_ids;
  uint64_t train_bytes = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    (kept[i].val ? val_ids : train_ids).push_back(static_cast<uint32_t>(i));
    if (!kept[i].val) train_bytes += kept[i].length;
  }
  // Validation paragraphs in hash order: each evaluation's first windows then mix every source
  // instead of coming from the first files.
  std::sort(val_ids.begin(), val_ids.end(), [&](uint32_t a, uint32_t b) {
    return unit_interval(kept[a].hash, kSplitSalt) < unit_interval(kept[b].hash, kSplitSalt);
  });
  rep.paragraphs_train = static_cast<int64_t>(train_ids.size());
  rep.paragraphs_val = static_cast<int64_t>(val_ids.size());
  if (train_ids.empty()) throw ValueError("data build: only one paragraph was kept, too few for a training split");

  // ---- the tokenizer ----
  std::string tok_file = o.tokenizer;
  TempFile trained_tokenizer, sample;
  if (tok_file.empty()) {
    sample.path = unique_sibling(o.output, "bpe-sample");
    {
      AtomicWriter w(sample.path + ".txt");  // whole or absent; renamed onto sample.path + ".txt"
      const double frac = std::min(1.0, static_cast<double>(o.tokenizer_sample_bytes) / std::max<uint64_t>(1, train_bytes));
      for (uint32_t i : train_ids)
        if (frac >= 1 || unit_interval(kept[i].hash, kSampleSalt) < frac) {
          w.write(spill.read(kept[i].offset, kept[i].length));
          w.write("\n\n", 2);
        }
      w.commit();
    }
    sample.path += ".txt";
    trained_tokenizer.path = unique_sibling(tokenizer_path(o.output), "tmp") + ".json";
    BpeTrainOptions bpe;
    bpe.vocab_size = static_cast<size_t>(o.vocab_size);
    bpe.progress = o.progress;
    train_bpe({sample.path}, bpe, trained_tokenizer.path);
    tok_file = trained_tokenizer.path;
    rep.tokenizer_trained = true;
  }
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(tok_file);
  rep.tokenizer = rep.tokenizer_trained ? tokenizer_path(o.output) : o.tokenizer;
  rep.vocab_size = static_cast<int64_t>(tok->vocab_size());
  const int dtype_bytes = tok->vocab_size() <= 65536 ? 2 : 4;

  // ---- stage 2: tokens ----
  const double t2 = now_s();
  const std::string val_file = o.val_fraction > 0 ? val_path(o.output) : "";
  rep.val_output = val_file;
  AtomicWriter train_w(o.output);
  std::unique_ptr<AtomicWriter> val_w = val_file.empty() ? nullptr : std::make_unique<AtomicWriter>(val_file);
  std::vector<char> wbuf;
  const std::string sep = "\n\n";  // paragraphs end with a blank line, as in the input
  uint64_t tokenized_bytes = 0;
  auto tokenize = [&](const std::vector<uint32_t>& ids, AtomicWriter& w, uint64_t& count) {
    std::vector<std::string> texts;
    std::vector<std::vector<TokenId>> out;
    for (size_t pos = 0; pos < ids.size();) {
      texts.clear();
      size_t bytes = 0;
      while (pos < ids.size() && texts.size() < 4096 && bytes < (size_t(8) << 20)) {
        const Kept& k = kept[ids[pos++]];
        texts.push_back(spill.read(k.offset, k.length) + sep);
        bytes += texts.back().size();
      }
      out.assign(texts.size(), {});
      parallel_for(static_cast<int64_t>(texts.size()), 8, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) tok->encode_append(texts[i], EncodeOptions{}, out[i]);
      });
      for (const auto& v : out) {
        write_ids(w, v, dtype_bytes, wbuf);
        count += v.size();
      }
      tokenized_bytes += bytes;
      const double frac = static_cast<double>(tokenized_bytes) / std::max<uint64_t>(1, rep.kept_bytes);
      const double el = now_s() - t2;
      progress.update("tokenize", frac,
                      std::to_string(rep.train_tokens + rep.val_tokens) + " tokens  " +
                          std::to_string(static_cast<int64_t>((rep.train_tokens + rep.val_tokens) / std::max(el, 1e-9))) +
                          " tok/s");
    }
  };
  tokenize(train_ids, train_w, rep.train_tokens);
  if (val_w) tokenize(val_ids, *val_w, rep.val_tokens);
  progress.end_line();
  rep.tokenize_seconds = now_s() - t2;
  rep.tokens_per_s = static_cast<double>(rep.train_tokens + rep.val_tokens) / std::max(rep.tokenize_seconds, 1e-9);
  rep.seconds = now_s() - t0;
  std::string tok_text = tok->describe();
  if (rep.tokenizer_trained)
    for (size_t at; (at = tok_text.find(trained_tokenizer.path)) != std::string::npos;)
      tok_text.replace(at, trained_tokenizer.path.size(), rep.tokenizer);

  // ---- commit: every file is complete; rename them into place ----
  if (rep.tokenizer_trained) {
    CORELM_CHECK(::rename(trained_tokenizer.path.c_str(), rep.tokenizer.c_str()) == 0, IOError, rep.tokenizer,
                 ": cannot rename the trained tokenizer into place: ", std::strerror(errno));
    trained_tokenizer.path.clear();
  }
  if (val_w) {
    val_w->commit();
    write_file_atomic(val_file + ".json", sidecar(*tok, tok_text, dtype_bytes, rep.val_tokens, rep.paragraphs_val, "val", rep));
  }
  train_w.commit();
  if (dropped_log) dropped_log->commit();
  write_file_atomic(o.output + ".json", sidecar(*tok, tok_text, dtype_bytes, rep.train_tokens, rep.paragraphs_train, "train", rep));
  fsync_dir(fs::path(o.output).parent_path().empty() ? "." : fs::path(o.output).parent_path().string());
  if (val_file.empty()) {  // a validation file of an earlier build would no longer belong to this one
    std::error_code ec;
    fs::remove(val_path(o.output), ec);
    fs::remove(val_path(o.output) + ".json", ec);
  }
  return rep;
}

}  // namespace corelm::pipeline
