// TaskSpec: defaults, validation and the JSON form that is both the task file and the input of
// the task hash.
#include <climits>
#include <cstdint>
#include <set>

#include "corelm/error.h"
#include "corelm/pipeline.h"
#include "corelm/utf8.h"

namespace corelm::pipeline {

TaskKind parse_task_kind(const std::string& name) {
  if (name == "classify") return TaskKind::Classify;
  if (name == "extract") return TaskKind::Extract;
  if (name == "score") return TaskKind::Score;
  throw ValueError("unknown task '" + name + "' (expected classify, extract or score)");
}

std::string task_kind_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::Classify: return "classify";
    case TaskKind::Extract: return "extract";
    case TaskKind::Score: return "score";
  }
  return "?";
}

Truncate parse_truncate(const std::string& name) {
  if (name == "head") return Truncate::Head;
  if (name == "tail") return Truncate::Tail;
  if (name == "error") return Truncate::Error;
  throw ValueError("--truncate: '" + name + "' is not head, tail or error");
}

static std::string truncate_name(Truncate t) {
  return t == Truncate::Head ? "head" : t == Truncate::Tail ? "tail" : "error";
}

std::string TaskSpec::effective_template() const {
  if (!template_text.empty()) return template_text;
  switch (kind) {
    case TaskKind::Classify: return "{text}\nLabel:";
    case TaskKind::Extract: return "{text}\nAnswer:";
    case TaskKind::Score: return "{text}";
  }
  return "{text}";
}

void TaskSpec::validate() const {
  // Every string here reaches run.json and the manifest, which are JSON: valid UTF-8 only.
  require_utf8(template_text, "--template");
  require_utf8(text_field, "--text-field");
  require_utf8(id_field, "--id-field");
  require_utf8(label_prefix, "--label-prefix");
  for (const auto& l : labels) require_utf8(l, "--labels label");
  for (const auto& x : stop) require_utf8(x, "--stop");
  for (const auto& c : choices) require_utf8(c, "--choices choice");
  if (regex) require_utf8(*regex, "--regex");
  const std::string t = effective_template();
  const size_t at = t.find("{text}");
  CORELM_CHECK(at != std::string::npos, ValueError, "--template must contain {text}: '", t, "'");
  CORELM_CHECK(t.find("{text}", at + 1) == std::string::npos, ValueError, "--template holds {text} more than once");
  CORELM_CHECK(!text_field.empty(), ValueError, "--text-field must not be empty");
  CORELM_CHECK(max_context >= 0, ValueError, "--max-context must not be negative");
  if (kind == TaskKind::Classify) {
    CORELM_CHECK(labels.size() >= 2, ValueError, "classify needs --labels with at least two labels");
    std::set<std::string> seen;
    for (const auto& l : labels) {
      CORELM_CHECK(!l.empty(), ValueError, "--labels: empty label");
      CORELM_CHECK(seen.insert(l).second, ValueError, "--labels: '", l, "' given twice");
    }
  } else {
    CORELM_CHECK(labels.empty(), ValueError, "--labels is for classify only");
  }
  if (kind == TaskKind::Extract) {
    CORELM_CHECK(max_tokens >= 1, ValueError, "--max-tokens must be at least 1");
    CORELM_CHECK(choices.empty() || !regex, ValueError, "--choices and --regex are exclusive");
    for (const auto& c : choices) CORELM_CHECK(!c.empty(), ValueError, "--choices: empty choice");
    // An empty regex matches only the empty output, an empty stop string would stop before the
    // first token: both are mistakes (an unset shell variable), never a useful request.
    CORELM_CHECK(!regex || !regex->empty(), ValueError,
                 "--regex: empty pattern (it would allow only an empty output); leave --regex out for free text");
    for (const auto& x : stop)
      CORELM_CHECK(!x.empty(), ValueError, "--stop: empty stop string (it would end every output at once)");
  } else {
    CORELM_CHECK(choices.empty() && !regex && stop.empty(), ValueError,
                 "--choices, --regex and --stop are for extract only");
  }
}

nlohmann::ordered_json TaskSpec::to_json() const {
  nlohmann::ordered_json j;
  j["task"] = task_kind_name(kind);
  j["template"] = effective_template();
  j["text_field"] = text_field;
  j["id_field"] = id_field;
  if (kind == TaskKind::Classify) {
    j["labels"] = labels;
    j["label_prefix"] = label_prefix;
    j["label_eos"] = label_eos;
  }
  if (kind == TaskKind::Extract) {
    j["stop"] = stop;
    j["max_tokens"] = max_tokens;
    j["choices"] = choices;
    j["regex"] = regex.value_or("");  // "" when unset: the task hash of earlier runs is kept
  }
  j["max_context"] = max_context;
  j["truncate"] = truncate_name(truncate);
  j["add_special"] = add_special;
  return j;
}

namespace {

// Typed reads of one task-file key: a wrong type names the key and the type it needs.
[[noreturn]] void wrong_type(const std::string& key, const char* want, const nlohmann::json& v) {
  throw ValueError("task file key \"" + key + "\" must be " + want + ", got " + v.type_name());
}
std::string get_string(const std::string& key, const nlohmann::json& v) {
  if (!v.is_string()) wrong_type(key, "a string", v);
  return v.get<std::string>();
}
bool get_bool(const std::string& key, const nlohmann::json& v) {
  if (!v.is_boolean()) wrong_type(key, "true or false", v);
  return v.get<bool>();
}
int64_t get_int(const std::string& key, const nlohmann::json& v) {
  if (!v.is_number_integer()) wrong_type(key, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw ValueError("task file key \"" + key + "\" is out of range: " + v.dump());
  return v.get<int64_t>();
}
std::vector<std::string> get_strings(const std::string& key, const nlohmann::json& v) {
  if (!v.is_array()) wrong_type(key, "an array of strings", v);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      throw ValueError("task file key \"" + key + "\"[" + std::to_string(i) + "] must be a string, got " +
                       v[i].type_name());
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

}  // namespace

TaskSpec TaskSpec::from_json(const nlohmann::json& j) {
  CORELM_CHECK(j.is_object(), ValueError, "task file: expected a JSON object, got ", j.type_name());
  TaskSpec s;
  for (const auto& [key, v] : j.items()) {
    if (key == "task") s.kind = parse_task_kind(get_string(key, v));
    else if (key == "template") s.template_text = get_string(key, v);
    else if (key == "text_field") s.text_field = get_string(key, v);
    else if (key == "id_field") s.id_field = get_string(key, v);
    else if (key == "labels") s.labels = get_strings(key, v);
    else if (key == "label_prefix") s.label_prefix = get_string(key, v);
    else if (key == "label_eos") s.label_eos = get_bool(key, v);
    else if (key == "stop") {
      if (!v.is_string() && !v.is_array()) wrong_type(key, "a string or an array of strings", v);
      s.stop = v.is_string() ? std::vector<std::string>{v.get<std::string>()} : get_strings(key, v);
    }
    else if (key == "max_tokens") s.max_tokens = get_int(key, v);
    else if (key == "choices") s.choices = get_strings(key, v);
    else if (key == "regex") s.regex = get_string(key, v);
    else if (key == "max_context") s.max_context = get_int(key, v);
    else if (key == "truncate") s.truncate = parse_truncate(get_string(key, v));
    else if (key == "add_special") s.add_special = get_bool(key, v);
    else throw ValueError("task file: unknown key '" + escape_invalid_utf8(key) + "'");
  }
  return s;
}

}  // namespace corelm::pipeline
