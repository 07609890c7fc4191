// Fuzz target: arbitrary bytes as the generated text of an entity extraction, through
// parse_entities (`eval-task --task extract --entities`). Invariants: every entity has a
// non-empty upper-case type without ':' and a non-empty text with single spaces and no
// separator; printing the entities back as "TYPE: text; ..." and parsing again gives the same
// list with nothing malformed; the gold-side reader (entities_from_json) reads the same list from
// both of its shapes; and scoring the list against itself is perfect. Seeds: any text.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/eval_task.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace corelm::pipeline;
  const std::string text(reinterpret_cast<const char*>(data), size);
  int64_t malformed = 0;
  const std::vector<Entity> got = parse_entities(text, &malformed);
  if (malformed < 0) std::abort();
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::string printed;
  nlohmann::json objects = nlohmann::json::array(), strings = nlohmann::json::array();
  for (const Entity& e : got) {
    if (e.type.empty() || e.text.empty() || e.type.find(':') != std::string::npos) std::abort();
    for (const std::string* s : {&e.type, &e.text}) {
      if (space(s->front()) || space(s->back()) || s->find_first_of(";\n") != std::string::npos) std::abort();
      for (size_t i = 0; i < s->size(); ++i)
        if (space((*s)[i]) && ((*s)[i] != ' ' || (i + 1 < s->size() && space((*s)[i + 1])))) std::abort();
    }
    for (char c : e.type)
      if (std::islower(static_cast<unsigned char>(c))) std::abort();
    printed += (printed.empty() ? "" : "; ") + e.type + ": " + e.text;
    objects.push_back({{"type", e.type}, {"text", e.text}});
    strings.push_back(e.type + ": " + e.text);
  }
  int64_t malformed2 = 0;
  if (parse_entities(printed, &malformed2) != got || malformed2 != 0) std::abort();
  // The gold reader rejects invalid UTF-8 only through nlohmann's dump; it reads it as is.
  if (entities_from_json(objects, "fuzz:1", "entities") != got) std::abort();
  if (entities_from_json(strings, "fuzz:1", "entities") != got) std::abort();
  const EntityMetrics m = entity_metrics({got}, {got});
  if (m.n != 1 || m.exact_match != 1.0 || m.micro.correct != static_cast<int64_t>(got.size()) ||
      m.micro.predicted != m.micro.gold)
    std::abort();
  if (!got.empty() && m.micro.f1 != 1.0) std::abort();
  return 0;
}
