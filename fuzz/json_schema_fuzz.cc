// Fuzz target: arbitrary JSON as a JSON Schema (or, by the first byte, a regex, choices or
// json_object), then arbitrary bytes fed to the grammar. Compiling must succeed or throw
// corelm::ValueError; feeding must keep min_bytes_to_accept consistent (0 exactly when the state
// accepts); and the shortest completion of whatever was fed (followed byte by byte, each byte
// lowering the count by one) must be accepted, and for JSON grammars parse with nlohmann::json.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/constraint.h"
#include "corelm/error.h"

using corelm::infer::Grammar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 4;
  std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = rest.find('\0');
  const std::string spec = rest.substr(0, cut);
  const std::string feed = cut == std::string::npos ? std::string() : rest.substr(cut + 1);
  std::shared_ptr<const Grammar> g;
  try {
    if (mode == 0) {
      auto doc = nlohmann::ordered_json::parse(spec, nullptr, /*allow_exceptions=*/false);
      if (doc.is_discarded()) return 0;
      g = Grammar::json_schema(doc);
    } else if (mode == 1) {
      g = Grammar::regex(spec);
    } else if (mode == 2) {
      g = Grammar::json_object();
    } else {
      std::vector<std::string> choices;
      size_t at = 0;
      for (size_t bar; (bar = spec.find('|', at)) != std::string::npos; at = bar + 1) choices.push_back(spec.substr(at, bar - at));
      choices.push_back(spec.substr(at));
      g = Grammar::choices(choices);
    }
  } catch (const corelm::ValueError&) {
    return 0;
  }
  auto st = g->start();
  std::string text;
  for (char c : (mode == 2 ? spec + feed : feed)) {
    auto next = st->clone();
    if (!next->advance(std::string_view(&c, 1))) break;
    st = std::move(next);
    text += c;
    const int64_t m = st->min_bytes_to_accept();
    if (m < 0 || (m == 0) != st->accepts()) __builtin_trap();
  }
  // Follow the shortest completion.
  for (int64_t m = st->min_bytes_to_accept(); m > 0; --m) {
    bool next[256];
    st->next_bytes(next);
    bool moved = false;
    for (int b = 0; b < 256 && !moved; ++b) {
      if (!next[b]) continue;
      auto t = st->clone();
      const char c = static_cast<char>(b);
      if (t->advance(std::string_view(&c, 1)) && t->min_bytes_to_accept() == m - 1) {
        st = std::move(t);
        text += c;
        moved = true;
      }
    }
    if (!moved) __builtin_trap();
  }
  if (!st->accepts()) __builtin_trap();
  if (mode == 0 || mode == 2) {
    auto v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded() || (mode == 2 && !v.is_object())) __builtin_trap();
  }
  return 0;
}
