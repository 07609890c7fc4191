#include "pipeline/logprob_file.h"

#include <cmath>
#include <cstring>

#include "corelm/error.h"
#include "corelm/perplexity.h"

namespace corelm::pipeline {

std::string encode_logprob_header(const LogProbHeader& h) {
  std::string s(kLogProbMagic, 8);
  const uint32_t fields[8] = {kLogProbVersion, h.n_vocab, h.n_ctx, h.n_chunk, h.n_scored, h.bos,
                              static_cast<uint32_t>(h.bos_id), 0};
  s.append(reinterpret_cast<const char*>(fields), sizeof(fields));
  return s;
}

LogProbReader::LogProbReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
  CORELM_CHECK(in_.is_open(), IOError, "kl-base: cannot open ", path);
  char magic[8];
  uint32_t f[8];
  in_.read(magic, 8);
  in_.read(reinterpret_cast<char*>(f), sizeof(f));
  CORELM_CHECK(in_ && std::memcmp(magic, kLogProbMagic, 8) == 0, FormatError, "kl-base: ", path,
               " is not a corelm log-probability file (written by `corelm perplexity --save-logits`)");
  CORELM_CHECK(f[0] == kLogProbVersion, FormatError, "kl-base: ", path, ": unsupported version ", f[0]);
  h_ = {f[1], f[2], f[3], f[4], f[5], static_cast<int32_t>(f[6])};
  CORELM_CHECK(h_.n_vocab > 0 && h_.n_ctx >= 3 && h_.n_chunk > 0 && h_.n_scored == h_.n_ctx - 1 - h_.n_ctx / 2,
               FormatError, "kl-base: ", path, ": inconsistent header (n_vocab ", h_.n_vocab, ", n_ctx ", h_.n_ctx,
               ", n_chunk ", h_.n_chunk, ", n_scored ", h_.n_scored, ")");
  // 64-bit products of 32-bit fields: no overflow; the size check bounds every allocation below.
  const uint64_t expect = kLogProbHeaderBytes + uint64_t{h_.n_chunk} * h_.n_ctx * 4 +
                          uint64_t{h_.n_chunk} * h_.n_scored * h_.n_vocab * 4;
  in_.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in_.tellg());
  CORELM_CHECK(size == expect, FormatError, "kl-base: ", path, " has ", size, " bytes, its header says ", expect,
               " (truncated or not this format)");
  in_.seekg(static_cast<std::streamoff>(kLogProbHeaderBytes));
  tokens_.resize(size_t{h_.n_chunk} * h_.n_ctx);
  in_.read(reinterpret_cast<char*>(tokens_.data()), static_cast<std::streamsize>(tokens_.size() * 4));
  CORELM_CHECK(in_, IOError, "kl-base: reading the tokens of ", path);
}

void LogProbReader::read_chunks(int64_t rows, std::vector<float>& out) {
  const int64_t V = h_.n_vocab;
  out.resize(static_cast<size_t>(rows) * h_.n_scored * V);
  in_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size() * sizeof(float)));
  CORELM_CHECK(in_, IOError, "kl-base: reading log-probabilities from ", path_);
  for (int64_t r = 0; r < rows * h_.n_scored; ++r) {
    const float* lp = out.data() + r * V;
    double sum = 0;
    bool finite = true;
    for (int64_t v = 0; v < V && finite; ++v) {
      finite = std::isfinite(lp[v]) && lp[v] <= 1e-4f;
      sum += std::exp(double(lp[v]));
    }
    const int64_t chunk = chunks_read_ + r / h_.n_scored, pos = r % h_.n_scored;
    CORELM_CHECK(finite && std::fabs(std::log(sum)) <= 1e-3, FormatError, "kl-base: ", path_, ": chunk ", chunk,
                 ", scored position ", pos, " is not a log-probability distribution (",
                 finite ? "its probabilities sum to " + std::to_string(sum) : std::string("a value is not finite or > 0"),
                 "): the file is damaged");
  }
  chunks_read_ += rows;
}

}  // namespace corelm::pipeline
