// TaskSpec: defaults, validation and the JSON form that is both the task file and the input of
// the task hash.
#include <set>

#include "corelm/error.h"
#include "corelm/pipeline.h"

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
    CORELM_CHECK(choices.empty() || regex.empty(), ValueError, "--choices and --regex are exclusive");
    for (const auto& c : choices) CORELM_CHECK(!c.empty(), ValueError, "--choices: empty choice");
  } else {
    CORELM_CHECK(choices.empty() && regex.empty() && stop.empty(), ValueError,
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
    j["regex"] = regex;
  }
  j["max_context"] = max_context;
  j["truncate"] = truncate_name(truncate);
  j["add_special"] = add_special;
  return j;
}

TaskSpec TaskSpec::from_json(const nlohmann::json& j) {
  CORELM_CHECK(j.is_object(), ValueError, "task file: expected a JSON object");
  TaskSpec s;
  try {
    for (const auto& [key, v] : j.items()) {
      if (key == "task") s.kind = parse_task_kind(v.get<std::string>());
      else if (key == "template") s.template_text = v.get<std::string>();
      else if (key == "text_field") s.text_field = v.get<std::string>();
      else if (key == "id_field") s.id_field = v.get<std::string>();
      else if (key == "labels") s.labels = v.get<std::vector<std::string>>();
      else if (key == "label_prefix") s.label_prefix = v.get<std::string>();
      else if (key == "label_eos") s.label_eos = v.get<bool>();
      else if (key == "stop") s.stop = v.is_string() ? std::vector<std::string>{v.get<std::string>()} : v.get<std::vector<std::string>>();
      else if (key == "max_tokens") s.max_tokens = v.get<int64_t>();
      else if (key == "choices") s.choices = v.get<std::vector<std::string>>();
      else if (key == "regex") s.regex = v.get<std::string>();
      else if (key == "max_context") s.max_context = v.get<int64_t>();
      else if (key == "truncate") s.truncate = parse_truncate(v.get<std::string>());
      else if (key == "add_special") s.add_special = v.get<bool>();
      else throw ValueError("task file: unknown key '" + key + "'");
    }
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("task file: a value has the wrong type: ") + e.what());
  }
  return s;
}

}  // namespace corelm::pipeline
