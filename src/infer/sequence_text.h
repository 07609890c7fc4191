// The text side of one generated sequence, shared by TextGenerator and the Scheduler so both stream
// and stop identically: tokens are decoded incrementally (never splitting a UTF-8 character), the
// text is cut before the first stop string, and what is streamed holds back the longest tail that
// could still grow into a stop string.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "corelm/tokenizer.h"

namespace corelm::infer {

class SequenceText {
 public:
  // `stop` must outlive this object (the caller's options). `prompt` primes the decoder for
  // SentencePiece vocabularies, which drop the leading space of a text's first token: the
  // generated text continues the prompt, so the decoder is told the text has already started.
  SequenceText(const Tokenizer& tokenizer, const std::vector<std::string>& stop, std::span<const TokenId> prompt,
               int64_t allowed_vocab);

  // Feeds one generated token. `eos`: it ends the sequence with "stop" (its own text is not
  // decoded). `end_reason` (not null): the sequence ends after this token for that reason (the
  // budget is spent: "length"; a grammar is finished: "stop") unless a stop string ended it
  // first. Returns the text that became final (streamable) with this token.
  std::string accept(TokenId token, bool eos, const char* end_reason = nullptr);
  // Ends now with `reason`, without decoding what the decoder holds (nothing was generated, or the
  // sequence was cancelled: `emit` false keeps the held-back tail unstreamed). Returns what
  // became final.
  std::string finish(const char* reason, bool emit = true);

  bool finished() const { return finished_; }
  const std::string& finish_reason() const { return reason_; }
  const std::string& text() const { return text_; }  // everything decoded, cut at a stop string
  std::string streamed_text() const { return text_.substr(0, streamed_); }  // what emit has returned so far
  std::string take_text() { return std::move(text_); }

 private:
  void append(const std::string& piece);
  void end(const char* reason);
  std::string emit();

  StreamingDecoder decoder_;
  const std::vector<std::string>& stop_;
  std::string text_;
  size_t streamed_ = 0;
  bool finished_ = false;
  std::string reason_;
};

}  // namespace corelm::infer
