#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace corelm::tok {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points used stay below U+0144
  Tables() {
    from_cp.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_unicode(unsigned char b) { return tables().to_cp[b]; }

std::optional<std::string> byte_level_decode(std::string_view spelled) {
  const Tables& t = tables();
  const auto* p = reinterpret_cast<const unsigned char*>(spelled.data());
  size_t n = spelled.size(), i = 0;
  std::string out;
  out.reserve(n);
  while (i < n) {
    int len;
    uint32_t cp = decode_utf8(p + i, n - i, &len);
    if (cp >= t.from_cp.size() || t.from_cp[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.from_cp[cp]));
    i += len;
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_to_unicode(b));
  return out;
}

}  // namespace corelm::tok
