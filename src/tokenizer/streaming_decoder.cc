// StreamingDecoder: holds back the bytes of a character that is not complete yet, so a chat or
// generation loop can print as it goes without ever emitting half a character.
#include "corelm/tokenizer.h"
#include "tokenizer/unicode.h"

namespace corelm {

std::string StreamingDecoder::push(TokenId id) {
  std::string_view bytes = tok_.token_bytes(id);
  if (skip_special_ && tok_.is_special(id)) return {};
  if (!started_ && !bytes.empty() && !tok_.is_special(id)) {
    if (tok_.strips_leading_space() && bytes[0] == ' ') bytes.remove_prefix(1);
    started_ = true;
  }
  pending_.append(bytes);
  return drain(false);
}

std::string StreamingDecoder::flush() { return drain(true); }

std::string StreamingDecoder::drain(bool final) {
  size_t keep_from = final ? pending_.size() : tok::complete_utf8_prefix(pending_);
  std::string out = tok::to_valid_utf8(std::string_view(pending_).substr(0, keep_from));
  pending_.erase(0, keep_from);
  return out;
}

}  // namespace corelm
