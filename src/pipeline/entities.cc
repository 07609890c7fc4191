// Entity spans for `eval-task --task extract --entities`: the lenient reader of generated
// "TYPE: text; ..." lists, the gold-side JSON reader and the multiset precision/recall/F1. Apart
// from the runner (eval_task.cc) so the parser builds with core alone (fuzz/entities_fuzz.cc).
#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include "corelm/error.h"
#include "corelm/eval_task.h"
#include "corelm/utf8.h"
#include "pipeline/f1.h"

namespace corelm::pipeline {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n\f\v");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n\f\v") - b + 1);
}

std::string collapse_spaces(const std::string& s) {
  std::istringstream words(s);
  std::string w, out;
  while (words >> w) out += (out.empty() ? "" : " ") + w;
  return out;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// One "TYPE: text" entry; false when it has no ':' or an empty type or text.
bool parse_entry(const std::string& entry, Entity& e) {
  const size_t colon = entry.find(':');
  if (colon == std::string::npos) return false;
  e.type = upper(collapse_spaces(entry.substr(0, colon)));
  e.text = collapse_spaces(entry.substr(colon + 1));
  return !e.type.empty() && !e.text.empty();
}

void finish(EntityCounts& c) {
  c.precision = c.predicted ? static_cast<double>(c.correct) / c.predicted : 0;
  c.recall = c.gold ? static_cast<double>(c.correct) / c.gold : 0;
  c.f1 = f1_of(c.precision, c.recall);
}

nlohmann::ordered_json counts_json(const EntityCounts& c) {
  return {{"precision", c.precision}, {"recall", c.recall}, {"f1", c.f1},
          {"gold", c.gold},           {"predicted", c.predicted}, {"correct", c.correct}};
}

}  // namespace

std::vector<Entity> parse_entities(const std::string& generated, int64_t* malformed) {
  std::vector<Entity> out;
  size_t start = 0;
  while (start <= generated.size()) {
    size_t end = generated.find_first_of(";\n", start);
    if (end == std::string::npos) end = generated.size();
    const std::string entry = trim(generated.substr(start, end - start));
    start = end + 1;
    if (entry.empty() || upper(entry) == "NONE") continue;
    Entity e;
    if (parse_entry(entry, e)) out.push_back(std::move(e));
    else if (malformed) ++*malformed;
  }
  return out;
}

std::vector<Entity> entities_from_json(const nlohmann::json& gold, const std::string& where, const std::string& field) {
  const std::string what = where + ": entity field '" + field + "'";
  CORELM_CHECK(gold.is_array(), ValueError, what,
               " must be a list of {\"type\", \"text\"} objects or \"TYPE: text\" strings (an empty list: none)");
  std::vector<Entity> out;
  for (size_t i = 0; i < gold.size(); ++i) {
    const nlohmann::json& v = gold[i];
    Entity e;
    if (v.is_string()) {
      CORELM_CHECK(parse_entry(v.get<std::string>(), e), ValueError, what, " element ", i, ": '",
                   escape_invalid_utf8(v.get<std::string>()), "' is not \"TYPE: text\" with a non-empty type and text");
    } else if (v.is_object()) {
      auto t = v.find("type"), x = v.find("text");
      CORELM_CHECK(t != v.end() && t->is_string() && x != v.end() && x->is_string(), ValueError, what, " element ", i,
                   ": an object needs string fields \"type\" and \"text\"");
      e.type = upper(collapse_spaces(t->get<std::string>()));
      e.text = collapse_spaces(x->get<std::string>());
      CORELM_CHECK(!e.type.empty() && !e.text.empty(), ValueError, what, " element ", i, ": empty type or text");
    } else {
      throw ValueError(what + " element " + std::to_string(i) + ": must be an object or a string");
    }
    out.push_back(std::move(e));
  }
  return out;
}

EntityMetrics entity_metrics(const std::vector<std::vector<Entity>>& predictions,
                             const std::vector<std::vector<Entity>>& gold, int64_t malformed) {
  CORELM_CHECK(predictions.size() == gold.size(), ValueError, "entity metrics: ", predictions.size(),
               " predictions but ", gold.size(), " gold records");
  EntityMetrics m;
  m.n = static_cast<int64_t>(gold.size());
  m.malformed = malformed;
  int64_t exact = 0;
  for (size_t i = 0; i < gold.size(); ++i) {
    std::map<Entity, int64_t> g, p;
    for (const Entity& e : gold[i]) ++g[e], ++m.per_type[e.type].gold, ++m.micro.gold;
    for (const Entity& e : predictions[i]) ++p[e], ++m.per_type[e.type].predicted, ++m.micro.predicted;
    for (const auto& [e, c] : p) {
      auto it = g.find(e);
      if (it == g.end()) continue;
      const int64_t common = std::min(c, it->second);
      m.per_type[e.type].correct += common;
      m.micro.correct += common;
    }
    exact += g == p;
  }
  finish(m.micro);
  for (auto& [type, c] : m.per_type) finish(c);
  m.exact_match = m.n ? static_cast<double>(exact) / m.n : 0;
  return m;
}

nlohmann::ordered_json EntityMetrics::to_json() const {
  nlohmann::ordered_json j;
  j["records"] = n;
  j["precision"] = micro.precision;
  j["recall"] = micro.recall;
  j["f1"] = micro.f1;
  j["gold_entities"] = micro.gold;
  j["predicted_entities"] = micro.predicted;
  j["correct_entities"] = micro.correct;
  j["exact_match"] = exact_match;
  j["malformed_entries"] = malformed;
  nlohmann::ordered_json per = nlohmann::ordered_json::object();
  for (const auto& [type, c] : per_type) per[type] = counts_json(c);
  j["per_type"] = per;
  return j;
}

}  // namespace corelm::pipeline
