// Token data for the trainer: memory-mapped token files (or ids in memory), seeded random
// windows for training, sequential windows for validation/eval.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "corelm/error.h"
#include "corelm/tokenizer_corpus.h"
#include "corelm/train.h"

namespace corelm::train {
namespace {

struct Mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (addr && len) munmap(addr, len);
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TokenDataset TokenDataset::open(const std::string& token_file) {
  const std::string sidecar = token_file + ".json";
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(read_text(sidecar));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(sidecar + ": invalid JSON: " + e.what());
  }
  CORELM_CHECK(meta.is_object() && meta.contains("dtype") && meta["dtype"].is_string(), FormatError, sidecar,
               ": missing \"dtype\" (uint16 or uint32)");
  const std::string dtype = meta["dtype"].get<std::string>();
  CORELM_CHECK(dtype == "uint16" || dtype == "uint32", FormatError, sidecar, ": dtype '", dtype,
               "' is not uint16 or uint32");
  TokenDataset d;
  d.dtype_bytes_ = dtype == "uint16" ? 2 : 4;

  int fd = ::open(token_file.c_str(), O_RDONLY);
  CORELM_CHECK(fd >= 0, IOError, token_file, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw IOError(token_file + ": cannot stat");
  }
  const size_t len = static_cast<size_t>(st.st_size);
  if (len % d.dtype_bytes_ != 0) {
    ::close(fd);
    throw FormatError(token_file + ": size " + std::to_string(len) + " is not a multiple of " +
                      std::to_string(d.dtype_bytes_) + " (" + dtype + ")");
  }
  d.size_ = static_cast<int64_t>(len / d.dtype_bytes_);
  if (meta.contains("tokens") && meta["tokens"].is_number_integer()) {
    const int64_t expected = meta["tokens"].get<int64_t>();
    if (expected != d.size_) {
      ::close(fd);
      throw FormatError(token_file + ": holds " + std::to_string(d.size_) + " tokens but " + sidecar + " says " +
                        std::to_string(expected));
    }
  }
  auto m = std::make_shared<Mapping>();
  if (len > 0) {
    m->addr = mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->addr == MAP_FAILED) {
      m->addr = nullptr;
      ::close(fd);
      throw IOError(token_file + ": mmap failed: " + std::strerror(errno));
    }
    m->len = len;
  }
  ::close(fd);
  d.data_ = m->addr;
  d.keep_ = m;
  return d;
}

TokenDataset TokenDataset::from_ids(std::vector<TokenId> ids) {
  auto owner = std::make_shared<std::vector<TokenId>>(std::move(ids));
  TokenDataset d;
  d.dtype_bytes_ = 4;
  d.size_ = static_cast<int64_t>(owner->size());
  d.data_ = owner->data();
  d.keep_ = owner;
  return d;
}

TokenDataset TokenDataset::from_text_files(const Tokenizer& tokenizer, const std::vector<std::string>& files,
                                           int threads) {
  std::vector<TokenId> ids;
  for (const std::string& f : files) {
    std::vector<TokenId> part = encode_parallel(tokenizer, read_text(f), EncodeOptions{}, std::max(threads, 1));
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return from_ids(std::move(ids));
}

TokenId TokenDataset::operator[](int64_t i) const {
  if (dtype_bytes_ == 2) {
    uint16_t v;
    std::memcpy(&v, static_cast<const char*>(data_) + 2 * i, 2);
    return static_cast<TokenId>(v);
  }
  uint32_t v;
  std::memcpy(&v, static_cast<const char*>(data_) + 4 * i, 4);
  return static_cast<TokenId>(v);
}

int64_t TokenDataset::vocab_bound() const {
  if (vocab_bound_ < 0) {
    int64_t m = -1;
    for (int64_t i = 0; i < size_; ++i) m = std::max<int64_t>(m, (*this)[i]);
    vocab_bound_ = m + 1;
  }
  return vocab_bound_;
}

// ---------------------------------------------------------------------------------------------

WindowSampler::WindowSampler(const TokenDataset& data, int64_t begin, int64_t end, uint64_t seed)
    : data_(data), begin_(begin), end_(end), gen_(seed) {
  CORELM_CHECK(begin >= 0 && begin <= end && end <= data.size(), ValueError, "WindowSampler: range [", begin, ", ",
               end, ") outside the ", data.size(), " tokens");
}

Batch WindowSampler::next(int64_t batch, int64_t seq) {
  CORELM_CHECK(batch > 0 && seq > 0, ValueError, "WindowSampler: batch and seq must be positive");
  const int64_t span = end_ - begin_;
  CORELM_CHECK(span >= seq + 1, ValueError, "training data has ", span, " tokens, fewer than one window of ",
               seq + 1, " (seq + 1); use more data or a smaller --seq");
  std::vector<int64_t> ids(batch * seq), targets(batch * seq);
  const uint64_t starts = static_cast<uint64_t>(span - seq);  // a window needs seq + 1 tokens
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t s = begin_ + static_cast<int64_t>(gen_.below(starts));
    for (int64_t t = 0; t < seq; ++t) {
      ids[b * seq + t] = data_[s + t];
      targets[b * seq + t] = data_[s + t + 1];
    }
  }
  drawn_ += batch;
  return Batch{Tensor::from_vector(ids, {batch, seq}), Tensor::from_vector(targets, {batch, seq})};
}

void check_val_fraction(double val_fraction) {
  CORELM_CHECK(std::isfinite(val_fraction) && val_fraction >= 0 && val_fraction < 1, ValueError,
               "train: --val-fraction must be in [0, 1) (0: no validation), got ", val_fraction);
}

Split split_tokens(int64_t size, double val_fraction, int64_t seq) {
  check_val_fraction(val_fraction);
  Split s;
  if (val_fraction == 0) {
    s.train_end = size;
    return s;
  }
  int64_t val = static_cast<int64_t>(static_cast<double>(size) * val_fraction);
  val = std::max(val, seq + 1);
  CORELM_CHECK(size - val >= seq + 1, ValueError, "data has ", size, " tokens: too few for a training split and a ",
               "validation split of ", val, " tokens with seq ", seq);
  s.train_end = size - val;
  return s;
}

std::vector<Batch> sequential_batches(const TokenDataset& data, int64_t begin, int64_t end, int64_t batch,
                                      int64_t seq, int64_t max_batches) {
  CORELM_CHECK(batch > 0 && seq > 0, ValueError, "sequential_batches: batch and seq must be positive");
  CORELM_CHECK(begin >= 0 && begin <= end && end <= data.size(), ValueError, "sequential_batches: range outside data");
  std::vector<int64_t> starts;
  for (int64_t s = begin; s + 1 < end; s += seq) starts.push_back(s);
  std::vector<Batch> out;
  for (size_t i = 0; i < starts.size(); i += batch) {
    if (max_batches >= 0 && static_cast<int64_t>(out.size()) >= max_batches) break;
    const int64_t rows = std::min<int64_t>(batch, static_cast<int64_t>(starts.size() - i));
    std::vector<int64_t> ids(rows * seq, 0), targets(rows * seq, -100);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t s = starts[i + r];
      const int64_t n = std::min(seq, end - 1 - s);  // targets available in this window
      for (int64_t t = 0; t < n; ++t) {
        ids[r * seq + t] = data[s + t];
        targets[r * seq + t] = data[s + t + 1];
      }
    }
    out.push_back(Batch{Tensor::from_vector(ids, {rows, seq}), Tensor::from_vector(targets, {rows, seq})});
  }
  return out;
}

}  // namespace corelm::train
