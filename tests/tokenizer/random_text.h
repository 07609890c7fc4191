// Seeded random test strings that stress the pre-tokenizer rules: contractions in both cases,
// runs of digits, every kind of whitespace, punctuation next to letters, combining marks (NFC),
// Hangul jamo, CJK, emoji sequences, special-token text, and random code points.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace corelm::test {

inline void put_utf8(std::string& out, uint32_t cp) {
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

class RandomText {
 public:
  explicit RandomText(uint64_t seed) : rng_(seed) {}

  // A valid UTF-8 string of 1..max_atoms atoms.
  std::string unicode(int max_atoms = 24) {
    static const std::vector<std::string> atoms = {
        "hello", "World", "the", " the", "I", "'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'Ve", "'m", "'M", "'ll",
        "'lL", "'d", "'D", "'", "'x", "\xC5\xBF", "don't", "WE'LL", "1", "12", "123", "1234", "2024", "3.14",
        "0000000", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\xC2\xA0", "\xE3\x80\x80",
        "\xE2\x80\x89", "\xC2\x85", "\x0B", "\x0C", "!", "?", ".", ",", "...", "!!!", "\"", "(", ")", "[", "]", "{",
        "}", "<", ">", "-", "--", "_", "/", "\\", "@", "#", "$", "%", "^", "&", "*", "~", "`", "|", ":", ";", "=",
        "+", "\xC3\xA9", "\xC3\x9F", "\xC3\x84", "e\xCC\x81", "\xCC\x81", "A\xCC\x8A", "\xE1\x84\x80\xE1\x85\xA1",
        "\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8", "\xE3\x81\x93\xE3\x82\x93", "\xED\x95\x9C\xEA\xB5\xAD",
        "\xF0\x9F\x9A\x80", "\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F", "\xF0\x9F\x87\xBA\xF0\x9F\x87\xB8",
        "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87", "\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1",
        "\xE1\x9E\x80\xE1\x9E\xB6", "\xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7",
        "\xE2\x85\xA7", "\xC2\xBD", "\xD9\xA3", "\xEF\xBC\x91", "<|endoftext|>", "<|im_start|>", "<|begin_of_text|>",
        "<s>", "</s>", "\xE2\x96\x81", "\xEF\xBF\xBD"};
    std::uniform_int_distribution<int> count(1, max_atoms);
    std::uniform_int_distribution<size_t> pick(0, atoms.size() - 1);
    std::uniform_int_distribution<int> coin(0, 9);
    std::string s;
    int n = count(rng_);
    for (int i = 0; i < n; ++i) {
      if (coin(rng_) == 0) put_utf8(s, random_code_point());
      else s += atoms[pick(rng_)];
    }
    return s;
  }

  // Arbitrary bytes (mostly invalid UTF-8), mixed with ASCII so pre-tokens still form.
  std::string bytes(int max_len = 64) {
    std::uniform_int_distribution<int> len(0, max_len), byte(0, 255), coin(0, 2);
    std::string s;
    int n = len(rng_);
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(coin(rng_) ? byte(rng_) : "ab 1\n'."[byte(rng_) % 7]));
    return s;
  }

  uint32_t random_code_point() {
    static const uint32_t ranges[][2] = {{0x20, 0x7F},     {0xA0, 0x800},     {0x800, 0x3000},
                                         {0x3000, 0xA000}, {0xAC00, 0xD7A4},  {0xE000, 0xFFFE},
                                         {0x10000, 0x10200}, {0x1F300, 0x1FA00}, {0x20000, 0x20100}};
    std::uniform_int_distribution<size_t> r(0, std::size(ranges) - 1);
    const auto& range = ranges[r(rng_)];
    std::uniform_int_distribution<uint32_t> cp(range[0], range[1] - 1);
    return cp(rng_);
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

}  // namespace corelm::test
