// Fuzz target: arbitrary bytes as a tokenizer.json. Loading must either succeed or throw a
// corelm::Error; a tokenizer that loads must encode and decode without crashing, and decode must
// give back the encoded bytes (less those its vocabulary has no token for).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "corelm/error.h"
#include "tokenizer/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  std::unique_ptr<corelm::Tokenizer> tok;
  try {
    tok = corelm::tok::make_bpe_tokenizer(corelm::tok::parse_hf_tokenizer_json(doc, "fuzz.json"));
  } catch (const corelm::Error&) {
    return 0;
  } catch (const nlohmann::json::exception&) {  // wrong JSON types; Tokenizer::load maps these to FormatError
    return 0;
  }
  // A vocabulary may lack some single-byte tokens: such a byte is dropped (or becomes
  // model.unk_token, and then the round trip cannot hold at all).
  bool dropped[256], lossless = true;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    const auto ids = tok->encode(one);
    dropped[b] = ids.empty();
    lossless &= dropped[b] || tok->decode(ids) == one;
  }
  // Compared without those bytes on both sides: an added token's text may hold them and comes back.
  auto without_dropped = [&](const std::string& s) {
    std::string out;
    for (char c : s)
      if (!dropped[static_cast<unsigned char>(c)]) out.push_back(c);
    return out;
  };
  for (const char* sample : {"Hello world, it's 2024!\n\n  x", "\xF0\x9F\x9A\x80 caf\xC3\xA9 \xFF\xFE <|endoftext|>"}) {
    for (bool special : {false, true}) {
      corelm::EncodeOptions opt;
      opt.parse_special = special;
      opt.add_special = special;
      auto ids = tok->encode(sample, opt);
      std::string back = tok->decode(ids);
      // The round trip must hold for plain text.
      if (!special && lossless && without_dropped(back) != without_dropped(sample)) std::abort();
    }
  }
  return 0;
}
