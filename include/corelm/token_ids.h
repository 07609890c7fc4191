// Token ids given by people and scripts (`corelm detokenize`'s stdin, token files): every id is
// an integer in [0, vocab_size). A value that does not fit the id type is an error naming its
// position, never a wrapped or truncated id (4294967368 used to become 72, 1.5 to 1 and 2^64-1
// to -1).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "corelm/tokenizer.h"

namespace corelm {

// `text` is a JSON array of integers or whitespace-separated decimal integers (empty or blank:
// no ids). FormatError for anything else ("<where>: position 3: 1.5 is not a token id (an
// integer)"); ValueError for an integer outside [0, vocab_size) ("<where>: position 1: token id
// 4294967368 is outside the vocabulary [0, 320)"). vocab_size 0 checks only that the id fits
// TokenId.
std::vector<TokenId> parse_token_ids(std::string_view text, const std::string& where, size_t vocab_size = 0);

// The same range check for ids that arrive already typed (a uint32 token file); ValueError
// naming `where` and the first position at fault.
void check_token_ids(std::span<const uint32_t> ids, const std::string& where, size_t vocab_size = 0);

}  // namespace corelm
