// The log-probability file of `corelm perplexity --save-logits` / `--kl-base` (format in
// include/corelm/perplexity.h): the header encoder and the reader of a base file. Apart from the
// perplexity run so that the reader, which parses untrusted files, is fuzzed on its own
// (fuzz/logprob_file_fuzz.cc) without building the model. Private to the pipeline.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace corelm::pipeline {

inline constexpr uint32_t kLogProbVersion = 1;
inline constexpr size_t kLogProbHeaderBytes = 8 + 8 * sizeof(uint32_t);

struct LogProbHeader {
  uint32_t n_vocab = 0, n_ctx = 0, n_chunk = 0, n_scored = 0, bos = 0;
  int32_t bos_id = -1;
};

std::string encode_logprob_header(const LogProbHeader& h);

// A base file: FormatError naming the file for a wrong magic or version, an inconsistent header or
// a size the header does not imply; IOError when unreadable. The tokens are read up front, the
// scored rows chunk by chunk in file order (the run visits chunks in that order).
class LogProbReader {
 public:
  explicit LogProbReader(const std::string& path);
  const LogProbHeader& header() const { return h_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The next `rows` chunks' log-probabilities [rows, n_scored, n_vocab]. Every row must be a
  // log-distribution (finite, <= 0, log-sum-exp 0 within 1e-3): a damaged row would otherwise turn
  // the KL divergence into NaN or a plausible-looking wrong number without a word. FormatError
  // naming the chunk and position otherwise; IOError past the end of the file.
  void read_chunks(int64_t rows, std::vector<float>& out);

 private:
  std::string path_;
  std::ifstream in_;
  LogProbHeader h_;
  int64_t chunks_read_ = 0;
  std::vector<int32_t> tokens_;
};

}  // namespace corelm::pipeline
