// Fuzz target: arbitrary bytes as a tokenizer.json. Loading must either succeed or throw a
// corelm::Error; a tokenizer that loads must encode and decode without crashing, and decode must
// give back the encoded bytes.
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
  for (const char* sample : {"Hello world, it's 2024!\n\n  x", "\xF0\x9F\x9A\x80 caf\xC3\xA9 \xFF\xFE <|endoftext|>"}) {
    for (bool special : {false, true}) {
      corelm::EncodeOptions opt;
      opt.parse_special = special;
      opt.add_special = special;
      auto ids = tok->encode(sample, opt);
      std::string back = tok->decode(ids);
      if (!special && back != sample) std::abort();  // round trip must hold for plain text
    }
  }
  return 0;
}
