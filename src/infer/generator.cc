// TextGenerator: prompts are prefilled through the KV cache (rows of different lengths padded on
// the right in one forward, then each row's length set back to its own, so padding is never
// attended to and is overwritten by the next token; the LM head runs only on each row's last
// prompt position), then every unfinished row advances one
// token per forward. Finished rows leave the batch. Each row owns its sampler and streaming
// decoder, so a prompt's output does not depend on the other prompts in the batch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/out_of_memory.h"
#include "infer/sequence_text.h"

namespace corelm::infer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One sequence being generated.
struct Row {
  std::vector<TokenId> context;  // prompt + generated
  int64_t prompt_len = 0;
  Sampler sampler;
  std::optional<SequenceText> text;  // made once the prompt is known (it primes the decoder)
  GenerationResult result;
  Row(const SamplingOptions& s, uint64_t seed) : sampler(s, seed) {}
  bool finished() const { return text->finished(); }
};

class Session {
 public:
  Session(const model::Decoder& decoder, const Tokenizer& tokenizer, const GenerateOptions& options,
          const StreamCallback& on_text)
      : decoder_(decoder), tok_(tokenizer), opt_(options), on_text_(on_text) {
    const auto& config = decoder.config();
    context_ = config.max_position_embeddings;
    vocab_ = config.vocab_size;
    allowed_vocab_ = std::min<int64_t>(vocab_, static_cast<int64_t>(tok_.vocab_size()));
    if (opt_.stop_at_eos) {
      if (tok_.eos_id()) eos_.push_back(*tok_.eos_id());
      if (config.eos_token_id >= 0) eos_.push_back(static_cast<TokenId>(config.eos_token_id));
      for (TokenId id : opt_.eos_ids) {
        CORELM_CHECK(id >= 0 && id < vocab_, ValueError, "generate: eos id ", id, " is outside the model's vocabulary of ",
                     vocab_, " tokens");
        eos_.push_back(id);
      }
    }
  }

  std::vector<GenerationResult> run(const std::vector<std::vector<TokenId>>& prompts) {
    rows_.reserve(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) add_row(i, prompts[i]);
    if (rows_.empty()) return {};
    autograd::NoGradGuard no_grad;
    model::KVCache cache = make_cache();

    auto t0 = Clock::now();
    int64_t prefill_tokens = prefill(cache);
    double prefill_s = seconds_since(t0);

    t0 = Clock::now();
    int64_t decode_tokens = 0;
    std::vector<int64_t> active, ids;
    std::vector<float> scratch(static_cast<size_t>(vocab_));
    for (;;) {
      active.clear();
      ids.clear();
      for (size_t r = 0; r < rows_.size(); ++r)
        if (!rows_[r].finished()) {
          active.push_back(static_cast<int64_t>(r));
          ids.push_back(rows_[r].context.back());
        }
      if (active.empty()) break;
      const Tensor step_ids = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size()), 1});
      if (fused_greedy()) {
        const std::vector<int64_t> next = decoder_.forward_cached_argmax(step_ids, cache, active, allowed_vocab_);
        for (size_t b = 0; b < active.size(); ++b) {
          accept_token(active[b], static_cast<TokenId>(next[b]));
          ++decode_tokens;
        }
        continue;
      }
      Tensor logits = decoder_.forward_cached(step_ids, cache, active).contiguous();
      const float* data = logits.data<float>();
      for (size_t b = 0; b < active.size(); ++b) {
        std::copy_n(data + b * vocab_, vocab_, scratch.begin());
        accept(active[b], scratch);
        ++decode_tokens;
      }
    }
    double decode_s = seconds_since(t0);

    std::vector<GenerationResult> out;
    out.reserve(rows_.size());
    for (Row& row : rows_) {
      GenerationResult& r = row.result;
      r.text = row.text->take_text();
      r.finish_reason = row.text->finish_reason();
      r.prompt_tokens = row.prompt_len;
      r.prefill_seconds = prefill_s;
      r.decode_seconds = decode_s;
      r.prefill_tok_s = prefill_s > 0 ? prefill_tokens / prefill_s : 0;
      r.decode_tok_s = decode_s > 0 ? decode_tokens / decode_s : 0;
      out.push_back(std::move(r));
    }
    return out;
  }

 private:
  void add_row(size_t index, std::vector<TokenId> ids) {
    CORELM_CHECK(!ids.empty(), ValueError, "prompt ", index, " is empty (0 tokens): give at least one token");
    const int64_t n = static_cast<int64_t>(ids.size());
    bool truncated = false;
    if (n > context_) {
      const int64_t keep = std::max<int64_t>(1, context_ - opt_.max_new_tokens);
      CORELM_CHECK(opt_.truncate == Truncate::Left, ValueError, "prompt ", index, " has ", n,
                   " tokens, context is ", context_, "; use --truncate left to keep the last ", keep, " tokens");
      ids.erase(ids.begin(), ids.end() - keep);
      truncated = true;
    }
    for (TokenId id : ids)
      CORELM_CHECK(id >= 0 && id < vocab_, ValueError, "prompt ", index, ": token id ", id,
                   " is outside the model's vocabulary (", vocab_, ")");
    Row& row = rows_.emplace_back(opt_.sampling, opt_.seed);
    row.prompt_len = static_cast<int64_t>(ids.size());
    row.context = std::move(ids);
    row.result.truncated = truncated;
    row.text.emplace(tok_, opt_.stop, row.context, allowed_vocab_);
    // Sequence length (prompt + generated) never exceeds the context.
    if (opt_.max_new_tokens == 0 || row.prompt_len >= context_) stream(row, row.text->finish("length"));
  }

  // The cache holds what the rows can reach: the longest prompt plus max_new_tokens (the last
  // sampled token is never fed back, so this has one position to spare), never more than the
  // context. Sizing it by the context alone made 16 prompts of a 260K-parameter model with a
  // 65,536 context take 1.3 GB, and a 2^31-1 context fail outright.
  model::KVCache make_cache() const {
    int64_t longest = 0;
    for (const Row& row : rows_) longest = std::max(longest, row.prompt_len);
    const int64_t reach = opt_.max_new_tokens >= context_ - longest ? context_ : longest + opt_.max_new_tokens;
    const int64_t capacity = std::max<int64_t>(1, std::min(context_, reach));
    const int64_t batch = static_cast<int64_t>(rows_.size());
    try {
      return decoder_.make_cache(batch, capacity);
    } catch (const OutOfMemoryError& e) {
      char mib[64];
      std::snprintf(mib, sizeof mib, "%.1f MiB", static_cast<double>(e.bytes()) / (1 << 20));
      throw OutOfMemoryError(e.bytes(), detail::concat(e.purpose(), ": generating ", batch, " prompt", batch == 1 ? "" : "s",
                                                       " needs ", mib, " of KV cache for ", capacity,
                                                       " positions each (the longest prompt, ", longest, " tokens, + ",
                                                       "max_new_tokens, at most the context of ", context_,
                                                       "); generate fewer prompts at once or fewer new tokens"));
    }
  }

  // Right-padded batched prefill; chunks of rows keep the [rows, T, V] logits bounded.
  int64_t prefill(model::KVCache& cache) {
    std::vector<int64_t> pending;
    for (size_t r = 0; r < rows_.size(); ++r)
      if (!rows_[r].finished()) pending.push_back(static_cast<int64_t>(r));
    int64_t tokens = 0;
    std::vector<float> scratch(static_cast<size_t>(vocab_));
    // A cache with sliding-window rings or linear-attention states (no position blocks) cannot
    // forget padding afterwards: such rows are prefilled in groups of equal prompt length.
    const bool can_pad = cache.supports_prefix_blocks();
    size_t begin = 0;
    while (begin < pending.size()) {
      size_t end = begin;
      int64_t t_max = 0;
      while (end < pending.size()) {
        if (!can_pad && end > begin && rows_[pending[end]].prompt_len != rows_[pending[begin]].prompt_len) break;
        int64_t t = std::max(t_max, rows_[pending[end]].prompt_len);
        if (end > begin && static_cast<int64_t>(end - begin + 1) * t * vocab_ > opt_.max_prefill_floats) break;
        t_max = t;
        ++end;
      }
      std::vector<int64_t> rows(pending.begin() + begin, pending.begin() + end);
      const int64_t b = static_cast<int64_t>(rows.size());
      std::vector<int64_t> ids(static_cast<size_t>(b * t_max), 0);
      for (int64_t i = 0; i < b; ++i) {
        const Row& row = rows_[rows[i]];
        std::copy(row.context.begin(), row.context.end(), ids.begin() + i * t_max);
      }
      // Logits only at each row's last prompt position: Logits::Last when no row is padded, else
      // the hidden states with the LM head applied to the rows' last real positions (same bits).
      const bool padded = std::any_of(rows.begin(), rows.end(), [&](int64_t r) { return rows_[r].prompt_len != t_max; });
      const Tensor batch_ids = Tensor::from_vector(ids, {b, t_max});
      Tensor logits;
      if (!padded) {
        logits = decoder_.forward_cached(batch_ids, cache, rows, model::Logits::Last).contiguous();
      } else {
        Tensor hidden = decoder_.forward_cached(batch_ids, cache, rows, model::Logits::None).contiguous();
        const int64_t H = hidden.size(2);
        Tensor last = Tensor::empty({b, H});
        for (int64_t i = 0; i < b; ++i)
          std::copy_n(hidden.data<float>() + (i * t_max + rows_[rows[i]].prompt_len - 1) * H, H,
                      last.data<float>() + i * H);
        logits = decoder_.logits_from_hidden(last).contiguous();
      }
      const float* data = logits.data<float>();
      for (int64_t i = 0; i < b; ++i) {
        Row& row = rows_[rows[i]];
        cache.set_length(rows[i], row.prompt_len);  // forget the padding
        tokens += row.prompt_len;
        std::copy_n(data + i * vocab_, vocab_, scratch.begin());
        accept(rows[i], scratch);
      }
      begin = end;
    }
    return tokens;
  }

  // Every row samples with the same options; when they pick the plain argmax over
  // [0, allowed_vocab_), the decoder's fused LM-head argmax gives the same token without the
  // [B, V] logits.
  bool fused_greedy() const { return opt_.sampling.is_plain_argmax(); }

  // Samples the next token of row r from its logits and applies every stopping rule.
  void accept(int64_t r, std::vector<float>& logits) {
    Row& row = rows_[r];
    accept_token(r, row.sampler.sample(logits, row.context, allowed_vocab_));
  }

  // Appends the chosen token to row r and applies every stopping rule (sequence_text.h).
  void accept_token(int64_t r, TokenId tok) {
    Row& row = rows_[r];
    row.context.push_back(tok);
    row.result.tokens.push_back(tok);
    const bool eos = std::find(eos_.begin(), eos_.end(), tok) != eos_.end();
    const bool out_of_budget = static_cast<int64_t>(row.result.tokens.size()) >= opt_.max_new_tokens ||
                               static_cast<int64_t>(row.context.size()) >= context_;
    stream(row, row.text->accept(tok, eos, out_of_budget ? "length" : nullptr));
  }

  void stream(Row& row, const std::string& piece) {
    if (!piece.empty() && on_text_) on_text_(static_cast<size_t>(&row - rows_.data()), piece);
  }

  const model::Decoder& decoder_;
  const Tokenizer& tok_;
  const GenerateOptions& opt_;
  const StreamCallback& on_text_;
  int64_t context_ = 0, vocab_ = 0, allowed_vocab_ = 0;
  std::vector<TokenId> eos_;
  std::vector<Row> rows_;
};

}  // namespace

TextGenerator::TextGenerator(const model::Decoder& decoder, const Tokenizer& tokenizer)
    : decoder_(decoder), tokenizer_(tokenizer) {}

int64_t TextGenerator::context() const { return decoder_.config().max_position_embeddings; }

std::vector<GenerationResult> TextGenerator::generate_ids(const std::vector<std::vector<TokenId>>& prompts,
                                                          const GenerateOptions& options,
                                                          const StreamCallback& on_text) const {
  options.sampling.validate();
  CORELM_CHECK(options.max_new_tokens >= 0, ValueError, "max_new_tokens must be >= 0 (got ", options.max_new_tokens, ")");
  for (const auto& s : options.stop) CORELM_CHECK(!s.empty(), ValueError, "stop strings must not be empty");
  Session session(decoder_, tokenizer_, options, on_text);
  return session.run(prompts);
}

std::vector<GenerationResult> TextGenerator::generate(const std::vector<std::string>& prompts,
                                                      const GenerateOptions& options,
                                                      const StreamCallback& on_text) const {
  EncodeOptions enc;
  enc.add_special = options.add_special;
  std::vector<std::vector<TokenId>> ids;
  ids.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(tokenizer_.encode(prompts[i], enc));
    if (!ids.back().empty()) continue;
    // An empty prompt (no text, and no BOS added for it) starts from BOS alone, as llama.cpp,
    // llama2.c and Hugging Face's generate() without input ids do; GPT-2-style vocabularies have
    // only <|endoftext|>, which is their EOS and serves as BOS too.
    const std::optional<TokenId> start = tokenizer_.bos_id() ? tokenizer_.bos_id() : tokenizer_.eos_id();
    CORELM_CHECK(start.has_value(), ValueError, "prompt ", i,
                 " is empty and the tokenizer has neither a BOS nor an EOS token to start generation from");
    ids.back().push_back(*start);
  }
  return generate_ids(ids, options, on_text);
}

GenerationResult TextGenerator::generate(const std::string& prompt, const GenerateOptions& options,
                                         const StreamCallback& on_text) const {
  return std::move(generate(std::vector<std::string>{prompt}, options, on_text).front());
}

}  // namespace corelm::infer
