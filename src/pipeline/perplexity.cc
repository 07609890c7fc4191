// llama.cpp's perplexity method and KL-divergence mode over corelm's inference path (see
// include/corelm/perplexity.h for the method and the log-probability file format).
#include "corelm/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>

#include "corelm/autograd.h"
#include "corelm/durable.h"
#include "corelm/error.h"
#include "pipeline/logprob_file.h"

namespace corelm::pipeline {
namespace {


// Mean and its standard error from running sums (0 error below two values or for a zero variance).
std::pair<double, double> mean_and_stderr(double sum, double sum2, int64_t n) {
  if (n < 1) return {0.0, 0.0};
  const double mean = sum / static_cast<double>(n);
  const double var = sum2 / static_cast<double>(n) - mean * mean;
  return {mean, var > 0 && n > 1 ? std::sqrt(var / static_cast<double>(n - 1)) : 0.0};
}

// Value at `fraction` of the sorted values, linear between neighbours.
double percentile(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return 0.0;
  const double p = fraction * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const double w = p - static_cast<double>(i);
  return (1 - w) * sorted[i] + w * sorted[std::min(i + 1, sorted.size() - 1)];
}

struct KLSums {
  double nll = 0, nll2 = 0, base = 0, base2 = 0, cross = 0, kld = 0, kld2 = 0, d = 0, d2 = 0, d_base = 0;
  int64_t same_top = 0, count = 0;
  std::vector<double> klds;
};

KLDivergence summarize(KLSums& s) {
  KLDivergence k;
  const int64_t n = s.count;
  const auto [mq, eq] = mean_and_stderr(s.nll, s.nll2, n);
  const auto [mb, eb] = mean_and_stderr(s.base, s.base2, n);
  k.ppl = std::exp(mq);
  k.ppl_stderr = k.ppl * eq;
  k.base_ppl = std::exp(mb);
  k.base_ppl_stderr = k.base_ppl * eb;
  // Covariance of the two means: cov(NLL_Q, NLL_base) / (n - 1), the same normalisation as the errors.
  const double cov = n > 1 ? (s.cross / double(n) - mq * mb) / double(n - 1) : 0.0;
  k.nll_correlation = eq > 0 && eb > 0 ? cov / (eq * eb) : 0.0;
  const auto [md, ed] = mean_and_stderr(s.d, s.d2, n);
  k.delta_ln_ppl = md;
  k.delta_ln_ppl_stderr = ed;
  k.delta_ppl = k.ppl - k.base_ppl;
  // Delta method: PPL_Q - PPL_base moves as PPL_Q * mean(d) + delta_ppl * mean(NLL_base) with
  // d = NLL_Q - NLL_base. Written over d rather than as var(Q) + var(base) - 2 cov, which cancels
  // catastrophically when the two runs are nearly equal (a file against itself gives exactly 0).
  const double cov_d_base = n > 1 ? (s.d_base / double(n) - md * mb) / double(n - 1) : 0.0;
  const double var = k.ppl * k.ppl * ed * ed + k.delta_ppl * k.delta_ppl * eb * eb + 2 * k.ppl * k.delta_ppl * cov_d_base;
  k.delta_ppl_stderr = std::sqrt(std::max(var, 0.0));
  const auto [mk, ek] = mean_and_stderr(s.kld, s.kld2, n);
  k.mean_kld = mk;
  k.mean_kld_stderr = ek;
  std::sort(s.klds.begin(), s.klds.end());
  k.max_kld = s.klds.empty() ? 0.0 : s.klds.back();
  k.p99_kld = percentile(s.klds, 0.99);
  k.median_kld = percentile(s.klds, 0.5);
  k.same_top = n > 0 ? double(s.same_top) / double(n) : 0.0;
  k.same_top_stderr = n > 1 ? std::sqrt(k.same_top * (1 - k.same_top) / double(n - 1)) : 0.0;
  return k;
}

size_t argmax(const float* x, int64_t n) {
  return static_cast<size_t>(std::max_element(x, x + n) - x);  // first index on ties
}

}  // namespace

std::vector<TokenId> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text, std::optional<TokenId> bos) {
  std::vector<TokenId> ids;
  if (bos) ids.push_back(*bos);
  tokenizer.encode_append(text, EncodeOptions{}, ids);
  return ids;
}

std::optional<TokenId> tokenizer_adds_bos(const Tokenizer& tokenizer) {
  const auto& prefix = tokenizer.special_prefix();
  if (tokenizer.bos_id() && prefix.size() == 1 && prefix[0] == *tokenizer.bos_id()) return tokenizer.bos_id();
  return std::nullopt;
}

PerplexityResult perplexity(const model::Decoder& decoder, const std::vector<TokenId>& tokens,
                            std::optional<TokenId> bos, const PerplexityOptions& o) {
  const model::ModelConfig& config = decoder.config();
  const int64_t V = config.vocab_size;
  const int64_t n_ctx = o.ctx;
  CORELM_CHECK(n_ctx >= 3, ValueError, "perplexity: --ctx must be at least 3 (half of each chunk is scored), got ", n_ctx);
  CORELM_CHECK(n_ctx <= config.max_position_embeddings, ValueError, "perplexity: --ctx ", n_ctx,
               " is above the model's context (max_position_embeddings ", config.max_position_embeddings, ")");
  CORELM_CHECK(o.batch >= 1, ValueError, "perplexity: --batch must be >= 1, got ", o.batch);
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  // llama.cpp refuses fewer than 2 * n_ctx tokens (one chunk would score only a half window).
  CORELM_CHECK(n_tokens >= 2 * n_ctx, ValueError, "perplexity: you need at least ", 2 * n_ctx,
               " tokens to evaluate perplexity with a context of ", n_ctx, "; the text tokenizes to only ", n_tokens);
  for (TokenId t : tokens)
    CORELM_CHECK(t >= 0 && t < V, ValueError, "perplexity: token id ", t, " outside the model's vocabulary (", V, ")");
  const int64_t first = n_ctx / 2;
  const int64_t n_scored = n_ctx - 1 - first;
  int64_t n_chunk = n_tokens / n_ctx;
  if (o.chunks >= 0) n_chunk = std::min(n_chunk, o.chunks);
  CORELM_CHECK(n_chunk >= 1, ValueError, "perplexity: --chunks must be >= 1");

  std::unique_ptr<LogProbReader> base;
  if (!o.kl_base.empty()) {
    base = std::make_unique<LogProbReader>(o.kl_base);
    const LogProbHeader& h = base->header();
    CORELM_CHECK(h.n_vocab == V, FormatError, "kl-base: ", o.kl_base, " was computed with a vocabulary of ", h.n_vocab,
                 " tokens, this model has ", V);
    CORELM_CHECK(h.n_ctx == n_ctx, FormatError, "kl-base: ", o.kl_base, " was computed with --ctx ", h.n_ctx,
                 ", this run uses ", n_ctx, " (pass --ctx ", h.n_ctx, ")");
    CORELM_CHECK((h.bos != 0) == bos.has_value() && (!bos || h.bos_id == *bos), FormatError, "kl-base: ", o.kl_base,
                 bos ? " was computed without BOS at chunk starts" : " was computed with BOS at chunk starts",
                 ", this model's tokenizer ", bos ? "adds" : "adds none");
    CORELM_CHECK(static_cast<int64_t>(h.n_chunk) <= n_tokens / n_ctx, FormatError, "kl-base: ", o.kl_base, " holds ",
                 h.n_chunk, " chunks, this text has only ", n_tokens / n_ctx, " (another file or tokenization?)");
    n_chunk = std::min<int64_t>(n_chunk, h.n_chunk);
    const auto& bt = base->tokens();
    for (int64_t i = 0; i < n_chunk * n_ctx; ++i)
      CORELM_CHECK(bt[static_cast<size_t>(i)] == tokens[static_cast<size_t>(i)], FormatError, "kl-base: ", o.kl_base,
                   " was computed on other tokens (first difference at token ", i, ": ", bt[static_cast<size_t>(i)],
                   " there, ", tokens[static_cast<size_t>(i)], " here): another text or tokenizer");
  }

  std::unique_ptr<AtomicWriter> out;
  if (!o.save_logits.empty()) {
    out = std::make_unique<AtomicWriter>(o.save_logits);
    const LogProbHeader h{static_cast<uint32_t>(V), static_cast<uint32_t>(n_ctx), static_cast<uint32_t>(n_chunk),
                          static_cast<uint32_t>(n_scored), bos ? 1u : 0u, bos ? *bos : -1};
    out->write(encode_logprob_header(h));
    out->write(tokens.data(), static_cast<size_t>(n_chunk * n_ctx) * sizeof(TokenId));
  }

  PerplexityResult r;
  r.tokens = n_tokens;
  r.ctx = n_ctx;
  r.chunks = n_chunk;
  r.bos = bos.has_value();
  autograd::NoGradGuard no_grad;
  const int64_t rows_max = std::min(o.batch, n_chunk);
  model::KVCache cache = decoder.make_cache(rows_max, n_ctx);
  double nll = 0, nll2 = 0;
  KLSums kl;
  std::vector<float> base_rows, logprob(static_cast<size_t>(V));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c0 = 0; c0 < n_chunk; c0 += rows_max) {
    const int64_t B = std::min(rows_max, n_chunk - c0);
    std::vector<int64_t> ids(static_cast<size_t>(B * n_ctx)), rows(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      rows[static_cast<size_t>(b)] = b;
      std::copy_n(tokens.begin() + (c0 + b) * n_ctx, n_ctx, ids.begin() + b * n_ctx);
      if (bos) ids[static_cast<size_t>(b * n_ctx)] = *bos;  // as llama.cpp: the chunk's first token becomes BOS
    }
    cache.reset();
    // Hidden states of every position, the LM head only on the scored ones.
    const Tensor hidden =
        decoder.forward_cached(Tensor::from_vector(ids, {B, n_ctx}), cache, rows, model::Logits::None);
    const Tensor logits = decoder.logits_from_hidden(hidden.slice(1, first, n_ctx - 1).contiguous()).contiguous();
    const float* L = logits.data<float>();
    if (base) base->read_chunks(B, base_rows);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = (c0 + b) * n_ctx;
      for (int64_t j = 0; j < n_scored; ++j) {
        const float* lg = L + (b * n_scored + j) * V;
        const float mx = *std::max_element(lg, lg + V);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(double(lg[v]) - mx);
        const double lse = mx + std::log(sum);
        const TokenId target = tokens[static_cast<size_t>(start + first + j + 1)];
        const double v_nll = lse - lg[target];
        nll += v_nll;
        nll2 += v_nll * v_nll;
        if (out || base)
          for (int64_t v = 0; v < V; ++v) logprob[static_cast<size_t>(v)] = static_cast<float>(lg[v] - lse);
        if (out) out->write(logprob.data(), logprob.size() * sizeof(float));
        if (base) {
          const float* lb = base_rows.data() + (b * n_scored + j) * V;
          double kld = 0;
          for (int64_t v = 0; v < V; ++v) kld += std::exp(double(lb[v])) * (double(lb[v]) - logprob[static_cast<size_t>(v)]);
          // Both NLLs from f32 log-probabilities, so a file compared with itself differs by exactly 0.
          const double nq = -double(logprob[static_cast<size_t>(target)]), nb = -double(lb[target]);
          kl.nll += nq;
          kl.nll2 += nq * nq;
          kl.base += nb;
          kl.base2 += nb * nb;
          kl.cross += nq * nb;
          kl.d += nq - nb;
          kl.d2 += (nq - nb) * (nq - nb);
          kl.d_base += (nq - nb) * nb;
          kl.kld += kld;
          kl.kld2 += kld * kld;
          kl.klds.push_back(kld);
          kl.same_top += argmax(lg, V) == argmax(lb, V);
          ++kl.count;
        }
      }
      r.count += n_scored;
      const auto [m, e] = mean_and_stderr(nll, nll2, r.count);
      r.running_ppl.push_back(std::exp(m));
      r.running_stderr.push_back(std::exp(m) * e);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.progress) o.progress({c0 + B, n_chunk, r.seconds, r.running_ppl.back()});
  }
  if (out) out->commit();
  const auto [m, e] = mean_and_stderr(nll, nll2, r.count);
  r.mean_nll = m;
  r.ppl = std::exp(m);
  r.ppl_stderr = r.ppl * e;
  if (base) r.kld = summarize(kl);
  return r;
}

}  // namespace corelm::pipeline
