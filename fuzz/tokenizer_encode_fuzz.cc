// Fuzz target: arbitrary bytes as text for the GPT-2, Llama-3 and Qwen2 pre-tokenizers and BPE.
// decode(encode(x)) must equal x for any bytes (less those a vocabulary has no token for), the
// streaming decoder must emit valid UTF-8, and nothing may crash. The tokenizers come from CORELM_FUZZ_TOKENIZERS (colon-separated paths),
// defaulting to the shared-data copies beside the source tree.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "corelm/error.h"
#include "corelm/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {
std::vector<std::unique_ptr<corelm::Tokenizer>>& tokenizers() {
  static std::vector<std::unique_ptr<corelm::Tokenizer>> list = [] {
    std::vector<std::unique_ptr<corelm::Tokenizer>> out;
    const char* env = std::getenv("CORELM_FUZZ_TOKENIZERS");
    std::string paths = env ? env
                            : std::string(CORELM_FUZZ_DATA) + "/gpt2/tokenizer.json:" + CORELM_FUZZ_DATA +
                                  "/llama3/tokenizer.json.zst:" + CORELM_FUZZ_DATA + "/qwen3/tokenizer.json.zst:" +
                                  CORELM_FUZZ_DATA + "/llama2/tokenizer.model";
    std::stringstream ss(paths);
    std::string p;
    while (std::getline(ss, p, ':'))
      if (!p.empty()) out.push_back(corelm::Tokenizer::load(p));
    return out;
  }();
  return list;
}

// Whether the tokenizer encodes byte b alone as nothing (its vocabulary has no token for it).
bool dropped(const corelm::Tokenizer& tok, unsigned char b) {
  static std::vector<std::pair<const corelm::Tokenizer*, std::vector<bool>>> cache;
  for (const auto& [t, d] : cache)
    if (t == &tok) return d[b];
  std::vector<bool> d(256);
  for (int c = 0; c < 256; ++c) d[c] = tok.encode(std::string(1, static_cast<char>(c))).empty();
  cache.emplace_back(&tok, d);
  return d[b];
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  for (auto& tok : tokenizers()) {
    corelm::EncodeOptions opt;
    opt.parse_special = size > 0 && (data[0] & 1);
    auto ids = tok->encode(text, opt);
    // SentencePiece reads a literal U+2581 as its whitespace marker and gives back a space, as the
    // reference library does; every other byte must come back unchanged.
    std::string expected = tok->normalize(text);  // NFC for Qwen2, as Hugging Face
    if (tok->strips_leading_space())
      for (size_t p; (p = expected.find("\xE2\x96\x81")) != std::string::npos;) expected.replace(p, 3, " ");
    // A vocabulary without some single-byte tokens (and no unk_token) drops those bytes, as HF
    // tokenizers does: compared without them on both sides (an added token's text may hold them),
    // nothing else may differ.
    auto without_dropped = [&](const std::string& s) {
      std::string out;
      for (char c : s)
        if (!dropped(*tok, static_cast<unsigned char>(c))) out.push_back(c);
      return out;
    };
    const std::string decoded = tok->decode(ids);
    if (without_dropped(decoded) != without_dropped(expected)) std::abort();
    corelm::StreamingDecoder stream(*tok, /*skip_special=*/false);
    std::string streamed;
    for (auto id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (!corelm::tok::is_valid_utf8(streamed)) std::abort();
    if (corelm::tok::is_valid_utf8(decoded) && streamed != decoded) std::abort();
  }
  return 0;
}
