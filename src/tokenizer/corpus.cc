// Corpus tokenization: the input is read in blocks (memory stays bounded by threads x chunk
// size), each block is cut at points where the tokenizer guarantees that encoding the pieces
// separately gives the same ids as encoding the whole, the pieces are encoded on worker threads,
// and the ids are written in input order.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/tokenizer_corpus.h"
#include "tokenizer/progress.h"

namespace corelm {
namespace {

// Runs fn(i) for i in [0, n) on up to `threads` threads.
template <typename Fn>
void parallel_for(size_t n, int threads, Fn fn) {
  size_t workers = std::min<size_t>(n, static_cast<size_t>(std::max(1, threads)));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
    });
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// The token file is written under a temp name beside OUTPUT and renamed into place only when
// complete (AtomicWriter): an interrupted or failed run leaves the previous file, never a cut one.
class TokenWriter {
 public:
  TokenWriter(const std::string& path, int dtype_bytes) : file_(path), dtype_bytes_(dtype_bytes) {}
  void write(const std::vector<TokenId>& ids, size_t vocab_size) {
    if (ids.empty()) return;
    buffer_.resize(ids.size() * dtype_bytes_);
    for (size_t i = 0; i < ids.size(); ++i) {
      uint32_t v = static_cast<uint32_t>(ids[i]);
      if (dtype_bytes_ == 2) {
        uint16_t h = static_cast<uint16_t>(v);
        std::memcpy(&buffer_[i * 2], &h, 2);  // little-endian hosts only (x86-64, arm64)
      } else {
        std::memcpy(&buffer_[i * 4], &v, 4);
      }
    }
    file_.write(buffer_.data(), buffer_.size());
    count_ += ids.size();
    (void)vocab_size;
  }
  void close() { file_.commit(); }
  uint64_t count() const { return count_; }

 private:
  AtomicWriter file_;
  int dtype_bytes_;
  std::vector<char> buffer_;
  uint64_t count_ = 0;
};

// Reads a file block by block; each block ends at a cut chosen by `cut` (the rest is carried).
class BlockReader {
 public:
  BlockReader(const std::string& path, size_t block) : path_(path), in_(path, std::ios::binary), block_(block) {
    CORELM_CHECK(in_.good(), IOError, path, ": cannot open: ", std::strerror(errno));
  }
  // Next block (empty at the end). cut(text) returns where to end the block given more follows.
  template <typename Cut>
  bool next(std::string& out, Cut cut) {
    size_t have = carry_.size();
    carry_.resize(std::max(block_, have + 1));
    in_.read(carry_.data() + have, static_cast<std::streamsize>(carry_.size() - have));
    CORELM_CHECK(!in_.bad(), IOError, path_, ": read failed");
    carry_.resize(have + static_cast<size_t>(in_.gcount()));
    if (carry_.empty()) return false;
    bool eof = in_.eof();
    size_t end = eof ? carry_.size() : cut(std::string_view(carry_));
    if (end == 0 && !eof) {  // no cut point in the whole block: grow it
      block_ *= 2;
      return next(out, cut);
    }
    out.assign(carry_, 0, end);
    carry_.erase(0, end);
    return true;
  }

 private:
  std::string path_;
  std::ifstream in_;
  size_t block_;
  std::string carry_;
};

bool printable(char c) { return c > ' ' && c < 0x7F; }

// A cut at i is safe when text[i-2..i] is "<printable ASCII>\n<printable ASCII>": the newline is
// then a pre-token of its own (or ends one) under every supported pattern, whether or not the
// text goes on. (With whitespace before the newline GPT-2's \s+(?!\S) would split the run
// differently at the end of a piece than in the middle of the text.)
bool safe_cut_at(std::string_view text, size_t i) {
  return i >= 2 && i < text.size() && text[i - 1] == '\n' && printable(text[i]) && printable(text[i - 2]);
}

size_t last_safe_cut(std::string_view text) {
  for (size_t i = text.size(); i-- > 2;)
    if (safe_cut_at(text, i)) return i;
  return 0;
}

std::string document_text(const std::string& line, const std::string& path, uint64_t line_no) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ":" + std::to_string(line_no) + ": invalid JSON: " + e.what());
  }
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("text") && j["text"].is_string()) return j["text"].get<std::string>();
  throw FormatError(path + ":" + std::to_string(line_no) + ": expected a JSON string or an object with a string \"text\"");
}

}  // namespace

size_t next_safe_cut(std::string_view text, size_t from) {
  size_t i = std::max<size_t>(from, 2);
  while (i < text.size()) {
    const void* nl = std::memchr(text.data() + i - 1, '\n', text.size() - (i - 1));
    if (!nl) break;
    size_t p = static_cast<const char*>(nl) - text.data() + 1;
    if (safe_cut_at(text, p)) return p;
    i = p + 1;
  }
  return text.size();
}

std::vector<TokenId> encode_parallel(const Tokenizer& tok, std::string_view text, const EncodeOptions& options,
                                     int threads) {
  if (threads <= 1 || !tok.splits_at_newlines() || text.size() < (size_t(1) << 16)) return tok.encode(text, options);
  size_t parts = static_cast<size_t>(threads) * 4;
  std::vector<size_t> cuts{0};
  for (size_t k = 1; k < parts; ++k) {
    size_t c = next_safe_cut(text, std::max(cuts.back() + 1, text.size() * k / parts));
    if (c >= text.size()) break;
    cuts.push_back(c);
  }
  cuts.push_back(text.size());
  std::vector<std::vector<TokenId>> ids(cuts.size() - 1);
  EncodeOptions plain = options;
  plain.add_special = false;
  parallel_for(ids.size(), threads, [&](size_t i) {
    tok.encode_append(text.substr(cuts[i], cuts[i + 1] - cuts[i]), plain, ids[i]);
  });
  std::vector<TokenId> out;
  if (options.add_special) out = tok.special_prefix();
  for (auto& part : ids) out.insert(out.end(), part.begin(), part.end());
  if (options.add_special) out.insert(out.end(), tok.special_suffix().begin(), tok.special_suffix().end());
  return out;
}

TokenFileStats tokenize_to_file(const Tokenizer& tok, const std::vector<std::string>& inputs, const std::string& output,
                                const TokenFileOptions& options) {
  TokenFileStats stats;
  int dtype_bytes = options.dtype == TokenDType::kUInt16 ? 2 : options.dtype == TokenDType::kUInt32 ? 4
                    : tok.vocab_size() <= 65536                ? 2
                                                               : 4;
  CORELM_CHECK(dtype_bytes == 4 || tok.vocab_size() <= 65536, ValueError, "uint16 token files hold ids below 65536 but the vocabulary has ",
               tok.vocab_size(), " entries; use uint32");
  stats.dtype_bytes = dtype_bytes;
  uint64_t total = 0;
  for (const std::string& path : inputs) {
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    CORELM_CHECK(!ec, IOError, path, ": cannot read: ", ec.message());
    total += size;
  }
  tok::Progress progress("tokenize", total, options.progress);
  TokenWriter writer(output, dtype_bytes);
  EncodeOptions enc;
  enc.add_special = options.add_special;
  enc.parse_special = options.parse_special;
  size_t block = options.chunk_bytes * static_cast<size_t>(std::max(1, options.threads));
  std::string text;
  for (const std::string& path : inputs) {
    if (!options.jsonl) {
      ++stats.documents;
      if (!tok.splits_at_newlines()) {  // one piece per document (SentencePiece)
        BlockReader reader(path, size_t(4) << 20);
        std::string all, part;
        while (reader.next(part, [](std::string_view t) { return t.size(); })) all += part;
        auto ids = tok.encode(all, enc);
        writer.write(ids, tok.vocab_size());
        stats.bytes += all.size();
        progress.update(stats.bytes, writer.count());
        continue;
      }
      BlockReader reader(path, block);
      bool first = true;
      std::vector<TokenId> ids;
      while (reader.next(text, last_safe_cut)) {
        if (first && options.add_special) writer.write(tok.special_prefix(), tok.vocab_size());
        first = false;
        EncodeOptions plain = enc;
        plain.add_special = false;
        ids = encode_parallel(tok, text, plain, options.threads);
        writer.write(ids, tok.vocab_size());
        stats.bytes += text.size();
        progress.update(stats.bytes, writer.count());
      }
      if (first && options.add_special) writer.write(tok.special_prefix(), tok.vocab_size());
      if (options.add_special) writer.write(tok.special_suffix(), tok.vocab_size());
      continue;
    }
    // JSONL: documents are lines; blocks end at a newline and their lines are shared out.
    BlockReader reader(path, block);
    uint64_t line_base = 0;
    while (reader.next(text, [](std::string_view t) {
      size_t nl = t.rfind('\n');
      return nl == std::string_view::npos ? 0 : nl + 1;
    })) {
      std::vector<std::string_view> lines;
      for (size_t pos = 0; pos < text.size();) {
        size_t nl = text.find('\n', pos);
        size_t end = nl == std::string::npos ? text.size() : nl;
        lines.push_back(std::string_view(text).substr(pos, end - pos));
        pos = end + 1;
      }
      size_t parts = std::min(lines.size(), static_cast<size_t>(std::max(1, options.threads)) * 4);
      std::vector<std::vector<TokenId>> ids(parts);
      std::vector<uint64_t> docs(parts, 0);
      parallel_for(parts, options.threads, [&](size_t p) {
        size_t lo = lines.size() * p / parts, hi = lines.size() * (p + 1) / parts;
        for (size_t i = lo; i < hi; ++i) {
          std::string_view line = lines[i];
          if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
          if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
          std::string doc = document_text(std::string(line), path, line_base + i + 1);
          tok.encode_append(doc, enc, ids[p]);
          ++docs[p];
        }
      });
      for (size_t p = 0; p < parts; ++p) {
        writer.write(ids[p], tok.vocab_size());
        stats.documents += docs[p];
      }
      line_base += lines.size();
      stats.bytes += text.size();
      progress.update(stats.bytes, writer.count());
    }
  }
  stats.tokens = writer.count();
  writer.close();
  stats.seconds = progress.elapsed();
  progress.finish(stats.bytes, stats.tokens);
  nlohmann::ordered_json meta;
  meta["format"] = "corelm token file: raw little-endian ids, no header";
  meta["dtype"] = dtype_bytes == 2 ? "uint16" : "uint32";
  meta["tokens"] = stats.tokens;
  meta["documents"] = stats.documents;
  meta["vocab_size"] = tok.vocab_size();
  meta["tokenizer"] = tok.describe();
  if (tok.eos_id()) meta["eos_id"] = *tok.eos_id();
  if (tok.bos_id()) meta["bos_id"] = *tok.bos_id();
  write_file_atomic(output + ".json", meta.dump(1) + "\n");
  return stats;
}

}  // namespace corelm
