// SequenceText: incremental decoding, stop strings and the streaming holdback of one sequence.
#include "infer/sequence_text.h"

#include <algorithm>

namespace corelm::infer {

SequenceText::SequenceText(const Tokenizer& tokenizer, const std::vector<std::string>& stop,
                           std::span<const TokenId> prompt, int64_t allowed_vocab)
    : decoder_(tokenizer, true), stop_(stop) {
  if (tokenizer.strips_leading_space())
    for (TokenId id : prompt)
      if (id < allowed_vocab) decoder_.push(id);
}

std::string SequenceText::accept(TokenId token, bool eos, const char* end_reason) {
  if (finished_) return {};
  if (eos) {
    append(decoder_.flush());
    if (!finished_) end("stop");
    return emit();
  }
  append(decoder_.push(token));
  if (!finished_ && end_reason != nullptr) {
    append(decoder_.flush());
    if (!finished_) end(end_reason);
  }
  return emit();
}

std::string SequenceText::finish(const char* reason, bool emit_text) {
  if (finished_) return {};
  end(reason);
  return emit_text ? emit() : std::string();
}

// Adds decoded text and cuts it at the first stop string, if one has appeared (only the new text
// and the stop string's length before it can hold a new match).
void SequenceText::append(const std::string& piece) {
  if (piece.empty() || finished_) return;
  const size_t old_len = text_.size();
  text_ += piece;
  size_t cut = std::string::npos;
  for (const auto& s : stop_) {
    size_t from = old_len >= s.size() ? old_len - s.size() + 1 : 0;
    size_t pos = text_.find(s, from);
    if (pos != std::string::npos) cut = std::min(cut, pos);
  }
  if (cut != std::string::npos) {
    text_.resize(std::max(cut, streamed_));
    end("stop");
  }
}

void SequenceText::end(const char* reason) {
  finished_ = true;
  reason_ = reason;
}

// The text that is final: all of it once the sequence is done, otherwise everything but the
// longest tail that could still grow into a stop string (that tail starts a character, because
// it equals the start of a valid UTF-8 stop string).
std::string SequenceText::emit() {
  size_t upto = text_.size();
  if (!finished_) {
    for (const auto& s : stop_) {
      for (size_t k = std::min(s.size() - 1, text_.size()); k > 0; --k) {
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          upto = std::min(upto, text_.size() - k);
          break;
        }
      }
    }
  }
  if (upto <= streamed_) return {};
  std::string out = text_.substr(streamed_, upto - streamed_);
  streamed_ = upto;
  return out;
}

}  // namespace corelm::infer
