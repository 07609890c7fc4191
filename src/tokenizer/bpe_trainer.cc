// BPE training in two passes. Counting streams the corpus in blocks, pre-tokenizes it with the
// chosen pattern and counts distinct pre-tokens (pruning the rarest when the table outgrows its
// bound, so memory does not grow with the corpus). Merging is the classic incremental algorithm:
// pair counts with, per pair, the words that contain it; a lazy max-heap picks the next merge and
// only the words holding that pair are rewritten.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/tokenizer_train.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/progress.h"

namespace corelm {
namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return tok::hash_bytes(s); }
};
using WordCounts = std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>>;

size_t last_cut(std::string_view text) {
  // Same rule as the corpus tokenizer: "<printable>\n<printable>" ends a pre-token everywhere.
  auto printable = [](char c) { return c > ' ' && c < 0x7F; };
  for (size_t i = text.size(); i-- > 2;)
    if (text[i - 1] == '\n' && printable(text[i]) && printable(text[i - 2])) return i;
  return 0;
}

void prune(WordCounts& counts, size_t bound) {
  for (uint64_t floor = 1; counts.size() > bound * 3 / 4; ++floor)
    std::erase_if(counts, [&](const auto& kv) { return kv.second <= floor; });
}

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct PairInfo {
  int64_t count = 0;
  std::vector<uint32_t> words;
};

// Before the (long) training: the output must be a file path in an existing folder. A folder
// given as --output was only found at the final rename.
void check_output(const std::string& output) {
  CORELM_CHECK(!output.empty(), ValueError, "the output path is empty (give the tokenizer.json to write)");
  std::error_code ec;
  const std::filesystem::path path(output);
  CORELM_CHECK(!std::filesystem::is_directory(path, ec), ValueError, output,
               " is a directory: give the file to write, e.g. ", (path / "tokenizer.json").string());
  const std::filesystem::path parent = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  CORELM_CHECK(std::filesystem::is_directory(parent, ec), IOError, output, ": its folder ", parent.string(),
               " does not exist");
}

}  // namespace

BpeTrainStats train_bpe(const std::vector<std::string>& inputs, const BpeTrainOptions& options,
                        const std::string& output) {
  BpeTrainStats stats;
  tok::SplitPattern pattern;
  if (options.pattern == "gpt2") pattern = tok::SplitPattern::kGpt2;
  else if (options.pattern == "llama3") pattern = tok::SplitPattern::kLlama3;
  else if (options.pattern == "qwen2") pattern = tok::SplitPattern::kQwen2;
  else throw ValueError("--pattern must be gpt2, llama3 or qwen2 (got '" + options.pattern + "')");
  size_t min_vocab = 256 + options.special_tokens.size();
  CORELM_CHECK(options.vocab_size >= min_vocab, ValueError, "--vocab-size must be at least ", min_vocab,
               " (256 byte tokens + ", options.special_tokens.size(), " special tokens)");
  CORELM_CHECK(!inputs.empty(), ValueError, "no --input files given");
  check_output(output);

  // Pass 1: count pre-tokens.
  uint64_t total = 0;
  for (const std::string& path : inputs) {
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    CORELM_CHECK(!ec, IOError, path, ": cannot read: ", ec.message());
    total += size;
  }
  tok::Progress count_progress("count", total, options.progress);
  WordCounts counts;
  tok::PretokScratch scratch;
  std::vector<tok::Span> spans;
  const size_t block = size_t(8) << 20;
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    CORELM_CHECK(in.good(), IOError, path, ": cannot open: ", std::strerror(errno));
    std::string buf;
    while (true) {
      size_t have = buf.size();
      buf.resize(have + block);
      in.read(buf.data() + have, static_cast<std::streamsize>(block));
      CORELM_CHECK(!in.bad(), IOError, path, ": read failed");
      buf.resize(have + static_cast<size_t>(in.gcount()));
      if (buf.empty()) break;
      bool eof = in.eof();
      size_t end = eof ? buf.size() : last_cut(buf);
      if (end == 0) continue;  // no cut point yet: read more
      std::string_view text(buf.data(), end);
      spans.clear();
      tok::split_pattern(pattern, text, scratch, spans);
      for (const tok::Span& s : spans) {
        std::string_view w = text.substr(s.begin, s.end - s.begin);
        auto it = counts.find(w);
        if (it != counts.end()) ++it->second;
        else counts.emplace(std::string(w), 1);
      }
      stats.words += spans.size();
      stats.bytes += end;
      if (counts.size() > options.max_distinct_words) prune(counts, options.max_distinct_words);
      count_progress.update(stats.bytes, stats.words);
      buf.erase(0, end);
      if (eof && buf.empty()) break;
    }
  }
  count_progress.finish(stats.bytes, stats.words);
  stats.count_seconds = count_progress.elapsed();
  stats.distinct_words = counts.size();

  // Pass 2: merges. Words are sorted so that ties and therefore the output are deterministic.
  tok::Progress merge_progress("merge", options.vocab_size, options.progress);
  std::vector<std::pair<std::string, uint64_t>> sorted(counts.begin(), counts.end());
  counts = WordCounts();
  std::sort(sorted.begin(), sorted.end());
  struct Word {
    std::vector<int32_t> syms;
    int64_t count;
  };
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (auto& [w, c] : sorted) {
    Word word{{}, static_cast<int64_t>(c)};
    for (unsigned char b : w) word.syms.push_back(b);
    words.push_back(std::move(word));
  }
  sorted.clear();
  sorted.shrink_to_fit();

  tok::BpeSpec spec;
  spec.source = output;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(std::string(1, static_cast<char>(b)));
  tok::StringIdMap token_ids;
  for (int b = 0; b < 256; ++b) token_ids.insert(spec.tokens[b], b);

  std::unordered_map<uint64_t, PairInfo> pairs;
  for (uint32_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].syms;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      PairInfo& p = pairs[pair_key(s[i], s[i + 1])];
      p.count += words[w].count;
      if (p.words.empty() || p.words.back() != w) p.words.push_back(w);
    }
  }
  // Max-heap on count; on ties the smaller pair key (older, shorter tokens) first.
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& x, const Entry& y) { return x.first != y.first ? x.first < y.first : x.second > y.second; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (auto& [key, info] : pairs) heap.push({info.count, key});

  size_t target_tokens = options.vocab_size - options.special_tokens.size();
  std::unordered_set<uint64_t> touched;
  while (spec.tokens.size() < target_tokens && !heap.empty()) {
    auto [count, key] = heap.top();
    heap.pop();
    auto it = pairs.find(key);
    int64_t actual = it == pairs.end() ? 0 : it->second.count;
    if (actual != count) {
      if (actual > 0) heap.push({actual, key});
      continue;
    }
    if (count < static_cast<int64_t>(options.min_frequency)) break;
    int32_t a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xFFFFFFFFu);
    std::string merged_bytes = spec.tokens[a] + spec.tokens[b];
    int32_t merged = token_ids.find(merged_bytes);
    if (merged < 0) {
      merged = static_cast<int32_t>(spec.tokens.size());
      spec.tokens.push_back(merged_bytes);
      token_ids.insert(merged_bytes, merged);
    }
    spec.merges.push_back({a, b, merged});
    std::vector<uint32_t> affected = std::move(it->second.words);
    it->second.words.clear();
    touched.clear();
    for (uint32_t w : affected) {
      Word& word = words[w];
      auto& s = word.syms;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size(); ++i)
        if (s[i] == a && s[i + 1] == b) { has = true; break; }
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) pairs[pair_key(s[i], s[i + 1])].count -= word.count;
      std::vector<int32_t> next;
      next.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(s[i]);
        }
      }
      s.swap(next);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t k = pair_key(s[i], s[i + 1]);
        PairInfo& p = pairs[k];
        p.count += word.count;
        if ((s[i] == merged || s[i + 1] == merged) && (p.words.empty() || p.words.back() != w)) p.words.push_back(w);
        touched.insert(k);
      }
    }
    for (uint64_t k : touched) {
      int64_t c = pairs[k].count;
      if (c > 0 && k != key) heap.push({c, k});
    }
    merge_progress.update(spec.tokens.size(), spec.merges.size());
  }
  merge_progress.finish(spec.tokens.size(), spec.merges.size());
  stats.merge_seconds = merge_progress.elapsed();
  stats.merges = spec.merges.size();

  for (const std::string& special : options.special_tokens) {
    CORELM_CHECK(!special.empty(), ValueError, "special tokens must not be empty");
    tok::AddedToken t;
    t.id = static_cast<int32_t>(spec.tokens.size() + spec.added.size());
    t.content = special;
    t.special = true;
    spec.added.push_back(t);
  }
  tok::PreTokStage stage;
  if (pattern == tok::SplitPattern::kGpt2) {
    stage.kind = tok::PreTokStage::kByteLevel;
    stage.use_regex = true;
    spec.stages.push_back(stage);
  } else {
    stage.kind = tok::PreTokStage::kSplit;
    stage.pattern = pattern;
    spec.stages.push_back(stage);
    tok::PreTokStage bl;
    bl.kind = tok::PreTokStage::kByteLevel;
    bl.use_regex = false;
    spec.stages.push_back(bl);
  }
  stats.vocab_size = spec.tokens.size() + spec.added.size();
  std::string json = tok::to_hf_tokenizer_json(spec);
  // A unique temp name beside the target, removed on every error path: a fixed "<output>.tmp"
  // was left behind on failure and shared by concurrent trainers.
  write_file_atomic(output, json + "\n");
  return stats;
}

}  // namespace corelm
