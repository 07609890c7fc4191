// Text generation: a sampler (logits -> next token, Hugging Face semantics for every knob) and a
// generator that prefills prompts through the KV cache in one batched forward, then decodes one
// token per step for all unfinished prompts at once. See docs/GENERATION.md for the semantics of
// each option and the context-length policy.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "corelm/model.h"
#include "corelm/random.h"
#include "corelm/tokenizer.h"

namespace corelm::infer {

// Order of application (as Hugging Face's logits processors/warpers): repetition penalty,
// no-repeat n-gram ban, then (unless greedy) temperature, top-k, top-p, min-p, and a draw.
// Temperatures below this are greedy decoding. Dividing logits by a smaller temperature makes
// the softmax a numerical argmax anyway, and by a tiny one (1e-38) overflows float to infinity,
// which used to pick the last id. 1e-5 sits far below any temperature that samples (0.1 is
// already nearly greedy) and far above the overflow.
constexpr float kGreedyTemperature = 1e-5f;

struct SamplingOptions {
  bool greedy = false;             // argmax (first index on ties); also implied by temperature < kGreedyTemperature
  float temperature = 1.0f;        // >= 0 and finite; below kGreedyTemperature (0 included): greedy
  int64_t top_k = 0;               // 0: off
  float top_p = 1.0f;              // 1: off; keeps the smallest top set with probability >= top_p
  float min_p = 0.0f;              // 0: off; drops tokens with p < min_p * p_max
  float repetition_penalty = 1.0f; // 1: off; >1 discourages tokens already in prompt + output
  int64_t no_repeat_ngram_size = 0;  // 0: off; bans tokens that would repeat an n-gram

  // ValueError naming the option: temperature negative or not finite, top_k < 0, top_p outside
  // (0, 1], min_p outside [0, 1], repetition_penalty <= 0 or not finite, no_repeat_ngram_size < 0.
  void validate() const;
  bool is_greedy() const { return greedy || temperature < kGreedyTemperature; }
  // Greedy with nothing that rewrites the logits first (repetition penalty, n-gram ban): the pick
  // is the plain argmax of the row and no random number is drawn, so a caller may take the
  // argmax without materialising the logits (the fused LM-head argmax of the generator).
  bool is_plain_argmax() const { return is_greedy() && repetition_penalty == 1.0f && no_repeat_ngram_size == 0; }
};

// In place, on one row of logits. `context` is the prompt plus the tokens generated so far.
void apply_repetition_penalty(std::span<float> logits, std::span<const TokenId> context, float penalty);
void ban_repeated_ngrams(std::span<float> logits, std::span<const TokenId> context, int64_t n);
// All of the above and the sampling filters, in place: removed tokens become -inf and the others
// hold their temperature-scaled logits (what HF's processors + warpers return). Greedy options
// leave the penalised logits. The draw is a softmax over the result.
void warp_logits(std::span<float> logits, std::span<const TokenId> context, const SamplingOptions& options);
// Index of the largest value; the first one on ties (as torch.argmax).
TokenId argmax(std::span<const float> logits);

// Turns logits into a token. Deterministic given the seed; one Sampler per sequence.
class Sampler {
 public:
  Sampler(SamplingOptions options, uint64_t seed);
  // `logits` is modified (scratch); ids >= `allowed_vocab` (when > 0) are never chosen, so a model
  // whose embedding table is padded past the tokenizer's vocabulary never emits unknown ids.
  TokenId sample(std::span<float> logits, std::span<const TokenId> context, int64_t allowed_vocab = 0);
  const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  Generator gen_;
  std::vector<std::pair<float, TokenId>> scratch_;
};

enum class Truncate { None, Left };

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  uint64_t seed = 0;  // every prompt samples from its own Generator(seed): batch-independent
  std::vector<std::string> stop;  // stop strings (cut from the text, like OpenAI's API)
  bool stop_at_eos = true;        // tokenizer eos_id, config eos_token_id and every id in eos_ids
  // More end-of-sequence ids, e.g. all of generation_config.json's eos_token_id list
  // (model::Checkpoint::eos_ids). Ignored when stop_at_eos is false; ids outside the vocabulary
  // are a ValueError.
  std::vector<TokenId> eos_ids;
  bool add_special = true;        // encode prompts with BOS etc. as the tokenizer configures
  // None: a prompt longer than the context is a ValueError. Left: it keeps its last
  // max(1, context - max_new_tokens) tokens.
  Truncate truncate = Truncate::None;
  // Rows whose prefill logits would exceed this many floats are prefilled in several forwards.
  int64_t max_prefill_floats = int64_t(64) << 20;
};

struct GenerationResult {
  std::string text;             // generated text only (valid UTF-8; the concatenation of the streamed pieces)
  std::vector<TokenId> tokens;  // every generated id, including a final EOS
  int64_t prompt_tokens = 0;    // after truncation
  bool truncated = false;
  std::string finish_reason;    // "stop" (EOS or a stop string) or "length" (max_new_tokens or context)
  // Whole-batch timings: prefill = the prompt forwards; decode = the one-token steps.
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_tok_s = 0, decode_tok_s = 0;
};

// Called with (prompt index, text piece) as text becomes final: never inside a UTF-8 character
// and never part of a stop string.
using StreamCallback = std::function<void(size_t, std::string_view)>;

class TextGenerator {
 public:
  // Both must outlive the generator. The context is config.max_position_embeddings.
  TextGenerator(const model::Decoder& decoder, const Tokenizer& tokenizer);

  // An empty prompt (no ids after encoding) starts from the tokenizer's BOS, or its EOS where it
  // has no BOS (GPT-2's <|endoftext|>); ValueError when it has neither. The KV cache is sized by
  // the longest prompt + max_new_tokens (at most the context); OutOfMemoryError says how much a
  // batch needs when that cannot be had.
  std::vector<GenerationResult> generate(const std::vector<std::string>& prompts, const GenerateOptions& options,
                                         const StreamCallback& on_text = {}) const;
  GenerationResult generate(const std::string& prompt, const GenerateOptions& options,
                            const StreamCallback& on_text = {}) const;
  // Token-level entry: prompts are ids (not re-encoded; add_special ignored); an empty one is a
  // ValueError.
  std::vector<GenerationResult> generate_ids(const std::vector<std::vector<TokenId>>& prompts,
                                             const GenerateOptions& options, const StreamCallback& on_text = {}) const;

  int64_t context() const;

 private:
  const model::Decoder& decoder_;
  const Tokenizer& tokenizer_;
};

}  // namespace corelm::infer
