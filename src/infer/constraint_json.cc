// Grammar::json_object: any JSON object (RFC 8259), as a character-level pushdown recogniser.
// Limits that keep decoding bounded and the output parseable by strict parsers:
//   - nesting of objects and arrays at most kMaxDepth (the top-level object counts as 1);
//   - no whitespace before or after the top-level object; where JSON allows whitespace, one run
//     of at most kMaxWs bytes (space, tab, \n, \r), so a model cannot loop on whitespace;
//   - numbers have at most 18 integer digits and 2 exponent digits, so every one fits a double
//     (strict parsers reject overflow) and every integer an int64;
//   - strings are valid UTF-8 (checked byte by byte: no overlongs, surrogates or code points
//     above U+10FFFF), control characters must be escaped, and a \u escape of a high surrogate
//     must be followed by one of a low surrogate (lone surrogates are rejected, as strict
//     parsers such as nlohmann::json do).
// The state is a fixed-size POD, so copying it is a memcpy and its bytes are its cache key.
#include <cstring>

#include "infer/constraint_impl.h"

namespace corelm::infer {
namespace constraint {
namespace {

constexpr int kMaxDepth = 16;
constexpr int kMaxWs = 16;
constexpr int kMaxIntDigits = 18;
constexpr int kMaxExpDigits = 2;

enum Mode : uint8_t {
  kStart,       // before the top-level '{'
  kDone,        // the top-level object is closed
  kObjFirst,    // after '{': '"' or '}'
  kObjKeyNext,  // after ',' in an object: '"'
  kObjColon,    // after a key: ':'
  kValue,       // a value must start
  kArrFirst,    // after '[': a value or ']'
  kAfterValue,  // ',' or the container's close
  kString,
  kNumber,
  kLiteral,
};

// String sub-states.
enum StrSub : uint8_t { kChars, kEscape, kHex, kLowBackslash, kLowU };
enum HexKind : uint8_t { kHexPlain, kHexHigh, kHexLow };
// Number sub-states (terminal: kZero, kInt, kFrac, kExp).
enum NumSub : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

const char* const kLiterals[3] = {"true", "false", "null"};

struct S {
  uint8_t stack[kMaxDepth];  // 'O' / 'A'; unused entries are 0 (the bytes are the cache key)
  uint8_t depth;
  uint8_t mode;
  uint8_t ws;  // length of the current whitespace run
  uint8_t is_key;
  uint8_t sub;
  uint8_t utf8_left;  // continuation bytes still due
  uint8_t lo, hi;     // range of the next continuation byte
  uint8_t hex_left, hex_kind, hex_d;  // \u digits still due; hex_d: the first digit was 'D'
  uint8_t lit, lit_pos;
  uint8_t digits;  // of the integer part / the exponent
};

bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_hex(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

class JsonState final : public StateImpl {
 public:
  void walk(const VocabIndex& ix, void* ctx, TokenSink sink) const override { walk_trie(*this, ix, ctx, sink); }
  JsonState() {
    std::memset(&s_, 0, sizeof s_);
    s_.mode = kStart;
  }
  std::unique_ptr<GrammarState> clone() const override { return std::make_unique<JsonState>(*this); }
  void assign_from(const StateImpl& o) override { s_ = static_cast<const JsonState&>(o).s_; }
  void key(std::string& out) const override { out.assign(reinterpret_cast<const char*>(&s_), sizeof s_); }
  bool accepts() const override { return s_.mode == kDone; }
  bool can_continue() const override { return s_.mode != kDone; }
  void next_bytes(bool out[256]) const override {
    for (int b = 0; b < 256; ++b) {
      JsonState t(*this);
      out[b] = t.step(static_cast<unsigned char>(b));
    }
  }

  int64_t min_bytes_to_accept() const override {
    // Bytes to finish what is open at the top, then one close per open container.
    const int64_t d = s_.depth;
    switch (s_.mode) {
      case kStart: return 2;  // {}
      case kDone: return 0;
      case kObjFirst: case kArrFirst: case kAfterValue: return d;
      case kObjKeyNext: return 4 + d;  // "":0
      case kObjColon: return 2 + d;    // :0
      case kValue: return 1 + d;       // 0
      case kNumber: return (s_.sub == kMinus || s_.sub == kDot || s_.sub == kE || s_.sub == kESign ? 1 : 0) + d;
      case kLiteral: return static_cast<int64_t>(std::strlen(kLiterals[s_.lit])) - s_.lit_pos + d;
      case kString: {
        int64_t n = 1;  // the closing quote
        switch (s_.sub) {
          case kChars: n += s_.utf8_left; break;
          case kEscape: n += 1; break;
          case kHex: n += s_.hex_left + (s_.hex_kind == kHexHigh ? 6 : 0); break;
          case kLowBackslash: n += 6; break;
          case kLowU: n += 5; break;
        }
        return n + (s_.is_key ? 2 : 0) + d;
      }
    }
    return 0;
  }

  bool step(unsigned char c) override {
    switch (s_.mode) {
      case kStart:
        if (c != '{') return false;
        return push('O', kObjFirst);
      case kDone:
        return false;
      case kString:
        return string_byte(c);
      case kNumber:
        return number_byte(c);
      case kLiteral:
        if (c != static_cast<unsigned char>(kLiterals[s_.lit][s_.lit_pos])) return false;
        if (kLiterals[s_.lit][++s_.lit_pos] == 0) value_end();
        return true;
      default:
        break;
    }
    // Structural positions: whitespace runs are allowed here.
    if (is_ws(c)) {
      if (s_.ws >= kMaxWs) return false;
      ++s_.ws;
      return true;
    }
    s_.ws = 0;
    return structural(c);
  }

 private:
  bool push(uint8_t kind, uint8_t mode) {
    if (s_.depth >= kMaxDepth) return false;
    s_.stack[s_.depth++] = kind;
    s_.mode = mode;
    return true;
  }
  // Clears every per-value field, so equal states have equal bytes (one cache entry).
  void value_end() {
    s_.mode = s_.depth == 0 ? kDone : kAfterValue;
    s_.sub = s_.is_key = s_.utf8_left = s_.lo = s_.hi = s_.hex_left = s_.hex_kind = s_.hex_d = s_.lit = s_.lit_pos = s_.digits = 0;
  }
  void close() {
    s_.stack[--s_.depth] = 0;
    value_end();
  }
  bool start_value(unsigned char c) {
    switch (c) {
      case '"': s_.mode = kString, s_.is_key = 0, s_.sub = kChars; return true;
      case '{': return push('O', kObjFirst);
      case '[': return push('A', kArrFirst);
      case '-': s_.mode = kNumber, s_.sub = kMinus; return true;
      case '0': s_.mode = kNumber, s_.sub = kZero, s_.digits = 1; return true;
      case 't': case 'f': case 'n':
        s_.mode = kLiteral, s_.lit = c == 't' ? 0 : c == 'f' ? 1 : 2, s_.lit_pos = 1;
        return true;
      default:
        if (c >= '1' && c <= '9') {
          s_.mode = kNumber, s_.sub = kInt, s_.digits = 1;
          return true;
        }
        return false;
    }
  }
  bool structural(unsigned char c) {
    const uint8_t top = s_.depth ? s_.stack[s_.depth - 1] : 0;
    switch (s_.mode) {
      case kObjFirst:
        if (c == '}') return close(), true;
        [[fallthrough]];
      case kObjKeyNext:
        if (c != '"') return false;
        s_.mode = kString, s_.is_key = 1, s_.sub = kChars;
        return true;
      case kObjColon:
        if (c != ':') return false;
        s_.mode = kValue;
        return true;
      case kArrFirst:
        if (c == ']') return close(), true;
        return start_value(c);
      case kValue:
        return start_value(c);
      case kAfterValue:
        if (c == ',') {
          s_.mode = top == 'O' ? kObjKeyNext : kValue;
          return true;
        }
        if ((c == '}' && top == 'O') || (c == ']' && top == 'A')) return close(), true;
        return false;
      default:
        return false;
    }
  }
  bool number_byte(unsigned char c) {
    switch (s_.sub) {
      case kMinus:
        if (c == '0') return s_.sub = kZero, s_.digits = 1, true;
        if (c >= '1' && c <= '9') return s_.sub = kInt, s_.digits = 1, true;
        return false;
      case kZero:
      case kInt:
        if (s_.sub == kInt && is_digit(c)) return s_.digits < kMaxIntDigits ? (++s_.digits, true) : false;
        if (c == '.') return s_.sub = kDot, s_.digits = 0, true;
        if (c == 'e' || c == 'E') return s_.sub = kE, s_.digits = 0, true;
        break;
      case kDot:
        return is_digit(c) ? (s_.sub = kFrac, true) : false;
      case kFrac:
        if (is_digit(c)) return true;
        if (c == 'e' || c == 'E') return s_.sub = kE, s_.digits = 0, true;
        break;
      case kE:
        if (c == '+' || c == '-') return s_.sub = kESign, true;
        return is_digit(c) ? (s_.sub = kExp, s_.digits = 1, true) : false;
      case kESign:
        return is_digit(c) ? (s_.sub = kExp, s_.digits = 1, true) : false;
      case kExp:
        if (is_digit(c)) return s_.digits < kMaxExpDigits ? (++s_.digits, true) : false;
        break;
    }
    // A complete number ends at the first byte that cannot extend it; that byte belongs to the
    // container (a number is never the top-level value, so depth >= 1 here).
    value_end();
    if (is_ws(c)) {
      s_.ws = 1;
      return true;
    }
    return structural(c);
  }
  bool string_byte(unsigned char c) {
    switch (s_.sub) {
      case kChars:
        if (s_.utf8_left) {
          if (c < s_.lo || c > s_.hi) return false;
          if (--s_.utf8_left) s_.lo = 0x80, s_.hi = 0xBF;
          else s_.lo = s_.hi = 0;
          return true;
        }
        if (c == '"') {
          if (s_.is_key) {
            value_end();
            s_.mode = kObjColon;
          } else {
            value_end();
          }
          return true;
        }
        if (c == '\\') return s_.sub = kEscape, true;
        if (c < 0x20) return false;
        if (c < 0x80) return true;
        return utf8_lead(c);
      case kEscape:
        if (c == 'u') {
          s_.sub = kHex, s_.hex_left = 4, s_.hex_kind = kHexPlain, s_.hex_d = 0;
          return true;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't')
          return s_.sub = kChars, true;
        return false;
      case kHex: {
        if (!is_hex(c)) return false;
        const int pos = 4 - s_.hex_left;
        const bool d = c == 'd' || c == 'D';
        if (s_.hex_kind == kHexLow) {
          if (pos == 0 && !d) return false;
          if (pos == 1 && !((c >= 'c' && c <= 'f') || (c >= 'C' && c <= 'F'))) return false;
        } else if (pos == 0) {
          s_.hex_d = d;
        } else if (pos == 1 && s_.hex_d) {
          if ((c >= 'c' && c <= 'f') || (c >= 'C' && c <= 'F')) return false;  // a lone low surrogate
          if (c == '8' || c == '9' || (c >= 'a' && c <= 'b') || (c >= 'A' && c <= 'B')) s_.hex_kind = kHexHigh;
        }
        if (--s_.hex_left == 0) {
          s_.sub = s_.hex_kind == kHexHigh ? kLowBackslash : kChars;
          s_.hex_kind = s_.hex_d = 0;
        }
        return true;
      }
      case kLowBackslash:
        return c == '\\' ? (s_.sub = kLowU, true) : false;
      case kLowU:
        if (c != 'u') return false;
        s_.sub = kHex, s_.hex_left = 4, s_.hex_kind = kHexLow;
        return true;
    }
    return false;
  }
  bool utf8_lead(unsigned char c) {
    s_.lo = 0x80, s_.hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) s_.utf8_left = 1;
    else if (c == 0xE0) s_.utf8_left = 2, s_.lo = 0xA0;
    else if (c == 0xED) s_.utf8_left = 2, s_.hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) s_.utf8_left = 2;
    else if (c == 0xF0) s_.utf8_left = 3, s_.lo = 0x90;
    else if (c == 0xF4) s_.utf8_left = 3, s_.hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) s_.utf8_left = 3;
    else return false;
    return true;
  }

  S s_;
};

class JsonObjectGrammar final : public Grammar {
 public:
  std::unique_ptr<GrammarState> start() const override { return std::make_unique<JsonState>(); }
  std::string describe() const override { return "json_object"; }
};

}  // namespace
}  // namespace constraint

std::shared_ptr<const Grammar> Grammar::json_object() {
  static const auto g = std::make_shared<const constraint::JsonObjectGrammar>();
  return g;
}

}  // namespace corelm::infer
