// Code-point classes come from ICU (Unicode 15 in Debian 12's ICU 72, the same Unicode version as
// the Oniguruma build inside Hugging Face tokenizers), flattened once into a byte table so the
// pre-tokenizer pays one load per code point.
#include "tokenizer/unicode.h"

#include "corelm/utf8.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <memory>
#include <mutex>
#include <vector>

#include "corelm/error.h"

namespace corelm::tok {
namespace {

const uint8_t* class_table() {
  static std::unique_ptr<uint8_t[]> table;
  static std::once_flag once;
  std::call_once(once, [] {
    table.reset(new uint8_t[0x110000]);
    for (UChar32 c = 0; c < 0x110000; ++c) {
      uint8_t k = kOther;
      if (c == '\r' || c == '\n') {
        k = kNewline;
      } else if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) {
        k = kSpace;
      } else {
        uint32_t mask = U_MASK(u_charType(c));
        if (mask & U_GC_L_MASK) k = kLetter;
        else if (mask & U_GC_N_MASK) k = kNumber;
      }
      table[c] = k;
    }
  });
  return table.get();
}

// Number of bytes of the maximal subpart of an ill-formed sequence starting at p (>= 1), per the
// Unicode "substitution of maximal subparts" practice.
size_t maximal_invalid_subpart(const unsigned char* p, size_t n) {
  unsigned c = p[0];
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
  else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
  else return 1;
  size_t i = 1;
  for (; i <= need && i < n; ++i) {
    unsigned b = p[i];
    if (i == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
  }
  return i;
}

}  // namespace

CpClass cp_class(uint32_t cp) {
  if (cp >= 0x110000) return kOther;
  return static_cast<CpClass>(class_table()[cp]);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) { return corelm::valid_utf8(s); }

size_t complete_utf8_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  // The last sequence starts at most 3 bytes before the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    size_t start = n - back;
    unsigned c = p[start];
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    if (c < 0xC2 || c > 0xF4) return n;
    size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (back >= need) return n;  // complete (or invalid, which is not our business here)
    // Incomplete: hold it back only if what we have is a valid prefix of some character.
    if (maximal_invalid_subpart(p + start, back) == back) return start;
    return n;
  }
  return n;
}

std::string to_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  std::string out;
  out.reserve(n);
  while (i < n) {
    if (p[i] < 0x80) { out.push_back(static_cast<char>(p[i++])); continue; }
    int len;
    uint32_t cp = decode_utf8(p + i, n - i, &len);
    if (cp < kInvalidBase) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += maximal_invalid_subpart(p + i, n - i);
    }
  }
  return out;
}

namespace {
std::string nfc_valid(std::string_view s) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* norm = unorm2_getNFCInstance(&err);
  CORELM_CHECK(U_SUCCESS(err), Error, "ICU NFC normalizer unavailable: ", u_errorName(err));
  std::vector<UChar> u16(s.size() + 1);
  int32_t u16_len = 0;
  err = U_ZERO_ERROR;
  u_strFromUTF8(u16.data(), static_cast<int32_t>(u16.size()), &u16_len, s.data(), static_cast<int32_t>(s.size()), &err);
  CORELM_CHECK(U_SUCCESS(err), Error, "ICU UTF-8 conversion failed: ", u_errorName(err));
  err = U_ZERO_ERROR;
  if (unorm2_isNormalized(norm, u16.data(), u16_len, &err) && U_SUCCESS(err)) return std::string(s);
  std::vector<UChar> out(static_cast<size_t>(u16_len) * 3 + 16);
  err = U_ZERO_ERROR;
  int32_t out_len = unorm2_normalize(norm, u16.data(), u16_len, out.data(), static_cast<int32_t>(out.size()), &err);
  CORELM_CHECK(U_SUCCESS(err), Error, "ICU NFC normalization failed: ", u_errorName(err));
  std::string result(static_cast<size_t>(out_len) * 3 + 4, '\0');
  int32_t result_len = 0;
  err = U_ZERO_ERROR;
  u_strToUTF8(result.data(), static_cast<int32_t>(result.size()), &result_len, out.data(), out_len, &err);
  CORELM_CHECK(U_SUCCESS(err), Error, "ICU UTF-8 conversion failed: ", u_errorName(err));
  result.resize(result_len);
  return result;
}
}  // namespace

std::string nfc(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  // Fast path: code points below U+0300 are never changed by NFC and never compose with what
  // follows... except that a following combining mark may compose with them, so only pure ASCII
  // plus Latin-1 without any code point >= U+0300 is returned untouched.
  bool simple = true;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0xCC) { simple = false; break; }  // lead bytes of U+0300 and above
  }
  if (simple) return std::string(s);
  std::string out;
  out.reserve(n);
  size_t i = 0, run = 0;
  while (i < n) {
    int len;
    uint32_t cp = decode_utf8(p + i, n - i, &len);
    if (cp >= kInvalidBase) {
      if (i > run) out += nfc_valid(s.substr(run, i - run));
      out.push_back(s[i]);
      i += 1;
      run = i;
    } else {
      i += len;
    }
  }
  if (n > run) out += nfc_valid(s.substr(run, n - run));
  return out;
}

}  // namespace corelm::tok
