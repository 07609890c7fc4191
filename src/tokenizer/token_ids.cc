// Token-id parsing with range checks; see include/corelm/token_ids.h.
#include "corelm/token_ids.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "corelm/utf8.h"

namespace corelm {
namespace {

constexpr uint64_t kMaxId = static_cast<uint64_t>(std::numeric_limits<TokenId>::max());

// Ids at or past this are refused: the vocabulary when known, else what TokenId holds.
uint64_t id_limit(size_t vocab_size) { return vocab_size == 0 ? kMaxId + 1 : std::min<uint64_t>(vocab_size, kMaxId + 1); }

std::string range_text(size_t vocab_size) {
  return vocab_size == 0 ? "the id range [0, " + std::to_string(kMaxId + 1) + ")"
                         : "the vocabulary [0, " + std::to_string(vocab_size) + ")";
}

// `value` is the id as written (for the message); `negative` when it has a minus sign.
TokenId checked(uint64_t v, bool negative, const std::string& value, size_t pos, const std::string& where,
                size_t vocab_size) {
  CORELM_CHECK(!negative && v < id_limit(vocab_size), ValueError, where, ": position ", pos, ": token id ", value,
               " is outside ", range_text(vocab_size));
  return static_cast<TokenId>(v);
}

[[noreturn]] void not_an_id(const std::string& value, size_t pos, const std::string& where) {
  throw FormatError(where + ": position " + std::to_string(pos) + ": " + value +
                    " is not a token id (ids are non-negative integers)");
}

std::vector<TokenId> from_json(std::string_view text, const std::string& where, size_t vocab_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": expected a JSON array of token ids: " + e.what());
  }
  CORELM_CHECK(j.is_array(), FormatError, where, ": expected a JSON array of token ids");
  std::vector<TokenId> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& x = j[i];
    // dump() shows the value as written (1.5, 1e+30, "7"), never a converted one.
    if (x.is_number_unsigned()) ids.push_back(checked(x.get<uint64_t>(), false, x.dump(), i, where, vocab_size));
    else if (x.is_number_integer()) {
      const int64_t v = x.get<int64_t>();
      ids.push_back(checked(static_cast<uint64_t>(v < 0 ? 0 : v), v < 0, x.dump(), i, where, vocab_size));
    } else {
      not_an_id(x.dump(), i, where);
    }
  }
  return ids;
}

std::vector<TokenId> from_words(std::string_view text, const std::string& where, size_t vocab_size) {
  std::vector<TokenId> ids;
  size_t i = 0;
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (true) {
    while (i < text.size() && space(text[i])) ++i;
    if (i == text.size()) break;
    size_t end = i;
    while (end < text.size() && !space(text[end])) ++end;
    const std::string word(text.substr(i, end - i));
    const size_t pos = ids.size();
    const bool negative = word[0] == '-';
    const char* begin = word.data() + (negative ? 1 : 0);
    const char* stop = word.data() + word.size();
    const bool digits_only = begin != stop && std::all_of(begin, stop, [](char c) { return c >= '0' && c <= '9'; });
    if (!digits_only) not_an_id("'" + escape_invalid_utf8(word) + "'", pos, where);
    uint64_t v = 0;
    const bool too_big = std::from_chars(begin, stop, v).ec == std::errc::result_out_of_range;
    // An integer, but with a minus sign or more than 64 bits of it: outside any vocabulary.
    ids.push_back(checked(too_big ? kMaxId + 1 : v, negative, word, pos, where, vocab_size));
    i = end;
  }
  return ids;
}

}  // namespace

std::vector<TokenId> parse_token_ids(std::string_view text, const std::string& where, size_t vocab_size) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return text[first] == '[' ? from_json(text, where, vocab_size) : from_words(text, where, vocab_size);
}

void check_token_ids(std::span<const uint32_t> ids, const std::string& where, size_t vocab_size) {
  const uint64_t limit = id_limit(vocab_size);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= limit) checked(ids[i], false, std::to_string(ids[i]), i, where, vocab_size);
}

}  // namespace corelm
