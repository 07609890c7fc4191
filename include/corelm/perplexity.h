// Perplexity of a model over a text, by llama.cpp's `llama-perplexity` method, and its
// KL-divergence mode (compare a setting against saved log-probabilities of a base setting).
//
// The method (docs/PERPLEXITY.md): the whole text is tokenized once, BOS first when the tokenizer
// adds one (llama.cpp's common_tokenize(..., add_special = true)); the stream is cut into
// non-overlapping chunks of n_ctx tokens (the tail shorter than n_ctx is dropped); each chunk is
// evaluated from an empty cache with its first token replaced by BOS (when the model adds BOS);
// only the second half is scored: the logits at positions n_ctx/2 .. n_ctx-2 predict the tokens at
// n_ctx/2+1 .. n_ctx-1 (n_ctx - 1 - n_ctx/2 predictions per chunk). PPL = exp(mean NLL); its
// standard error is PPL * sqrt(var(NLL) / (count - 1)) (delta method, as llama.cpp prints it).
// Fewer than 2 * n_ctx tokens is an error, as in llama.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "corelm/model.h"
#include "corelm/tokenizer.h"

namespace corelm::pipeline {

// The token stream llama.cpp scores: encode(text) without special-token parsing, BOS first when
// `bos` is set (no EOS).
std::vector<TokenId> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text, std::optional<TokenId> bos);

// The BOS a model's tokenizer puts first (its add_special prefix is exactly that BOS), or none.
std::optional<TokenId> tokenizer_adds_bos(const Tokenizer& tokenizer);

struct PerplexityProgress {
  int64_t chunks_done = 0, chunks_total = 0;
  double seconds = 0;  // since the first forward started
  double running_ppl = 0;
};

struct PerplexityOptions {
  int64_t ctx = 512;     // n_ctx: chunk length, 2..model context
  int64_t chunks = -1;   // at most this many chunks (< 0: every whole chunk)
  int64_t batch = 1;     // chunks evaluated together as rows of one forward
  std::string save_logits;  // write the scored positions' log-probabilities here (format below)
  std::string kl_base;      // compare against such a file (KL-divergence mode)
  std::function<void(const PerplexityProgress&)> progress;  // after every forward (may be empty)
};

// KL-divergence mode: the current model (Q) against the base file's log-probabilities.
struct KLDivergence {
  double ppl = 0, ppl_stderr = 0;            // PPL(Q) over the same tokens
  double base_ppl = 0, base_ppl_stderr = 0;  // PPL(base) from the file
  double mean_kld = 0, mean_kld_stderr = 0;  // mean KL(base || Q) per scored token, nats
  double max_kld = 0, p99_kld = 0, median_kld = 0;
  double same_top = 0, same_top_stderr = 0;  // fraction of positions whose argmax agrees (first index on ties)
  // Paired differences (the two NLLs of a token are correlated, so these errors are much smaller
  // than the two PPL errors combined as if independent).
  double delta_ln_ppl = 0, delta_ln_ppl_stderr = 0;  // mean(NLL_Q - NLL_base)
  double delta_ppl = 0, delta_ppl_stderr = 0;        // PPL(Q) - PPL(base), delta method with covariance
  double nll_correlation = 0;                        // Pearson correlation of NLL_Q and NLL_base
};

struct PerplexityResult {
  int64_t tokens = 0;      // tokens in the stream (BOS included)
  int64_t ctx = 0, chunks = 0;
  int64_t count = 0;       // scored predictions
  bool bos = false;        // chunks started with BOS
  double mean_nll = 0, ppl = 0, ppl_stderr = 0;
  std::vector<double> running_ppl, running_stderr;  // after each chunk, as llama.cpp's [i]ppl list
  double seconds = 0;      // model time (forwards + scoring)
  std::optional<KLDivergence> kld;  // with PerplexityOptions::kl_base
};

// Runs the method over `tokens` with `decoder` as prepared by the caller (precision, KV cache
// types: caches come from decoder.make_cache). ValueError for too few tokens, ctx outside
// [2, model context], batch < 1; FormatError for a base file of another tokenization, vocabulary
// or ctx; IOError for files that cannot be read or written.
PerplexityResult perplexity(const model::Decoder& decoder, const std::vector<TokenId>& tokens,
                            std::optional<TokenId> bos, const PerplexityOptions& options);

// The log-probability file (--save-logits / --kl-base), little-endian:
//   char[8] magic "CLMLOGP1"
//   u32 version (1), u32 n_vocab, u32 n_ctx, u32 n_chunk, u32 n_scored (= n_ctx - 1 - n_ctx/2),
//   u32 bos (1: chunks started with BOS), i32 bos_id (-1: none), u32 reserved (0)
//   i32 tokens[n_chunk * n_ctx]              the chunks' tokens as in the stream (before BOS)
//   f32 log_probs[n_chunk][n_scored][n_vocab] log-softmax at positions n_ctx/2 .. n_ctx-2
// f32 rather than llama.cpp's 16-bit quantized rows: small differences (bf16 vs f32) are measured
// without a quantization floor. Written atomically (temp file + rename).
inline constexpr char kLogProbMagic[8] = {'C', 'L', 'M', 'L', 'O', 'G', 'P', '1'};

}  // namespace corelm::pipeline
