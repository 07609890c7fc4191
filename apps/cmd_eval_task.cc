// corelm eval-task: score a task on labelled JSONL (classify: accuracy, macro-F1, confusion, ECE;
// extract: exact match and token F1, or entity precision/recall/F1 with --entities).
// Argument parsing and printing only; the evaluation lives in src/pipeline/eval_task.cc.
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli_escapes.h"
#include "command_registry.h"
#include "corelm/error.h"
#include "corelm/eval_task.h"

namespace corelm::cli {
namespace {

struct EvalTaskArgs {
  pipeline::EvalTaskOptions opt;
  std::string task = "classify";
  bool json = false;
  bool entities = false;
  bool label_field_given = false;
};

// One JSON line: the task's metrics plus what every task reports about its run.
void print_json(nlohmann::ordered_json j, const std::string& task, const pipeline::EvalTaskResult& r) {
  j["task"] = task;
  j["error_records"] = r.run.errors;
  j["input_tokens"] = r.run.input_tokens;
  j["tokens_per_s"] = r.run.tokens_per_s;
  std::cout << j.dump() << "\n";
}

void run(EvalTaskArgs& a) {
  pipeline::TaskSpec& t = a.opt.run.task;
  t.kind = pipeline::parse_task_kind(a.task);
  t.template_text = unescape(t.template_text);
  for (auto& s : t.stop) s = unescape(s);
  CORELM_CHECK(!a.entities || t.kind == pipeline::TaskKind::Extract, ValueError,
               "eval-task: --entities needs --task extract");
  if (t.kind == pipeline::TaskKind::Extract && a.entities) {
    a.opt.extract_metric = pipeline::ExtractMetric::Entities;
    if (!a.label_field_given) a.opt.label_field = "entities";
    const pipeline::EvalTaskResult r = pipeline::eval_extract(a.opt);
    const pipeline::EntityMetrics& m = r.entities;
    if (a.json) {
      print_json(m.to_json(), a.task, r);
      return;
    }
    std::printf("records %lld  entity precision %.4f  recall %.4f  F1 %.4f  (gold %lld, predicted %lld, correct %lld, "
                "%lld malformed entries)  %.0f input tokens/s  (%lld error records)\n",
                static_cast<long long>(m.n), m.micro.precision, m.micro.recall, m.micro.f1,
                static_cast<long long>(m.micro.gold), static_cast<long long>(m.micro.predicted),
                static_cast<long long>(m.micro.correct), static_cast<long long>(m.malformed), r.run.tokens_per_s,
                static_cast<long long>(r.run.errors));
    std::printf("%-10s %9s %9s %9s %8s %9s\n", "type", "precision", "recall", "f1", "gold", "predicted");
    for (const auto& [type, c] : m.per_type)
      std::printf("%-10s %9.4f %9.4f %9.4f %8lld %9lld\n", type.c_str(), c.precision, c.recall, c.f1,
                  static_cast<long long>(c.gold), static_cast<long long>(c.predicted));
    return;
  }
  if (t.kind == pipeline::TaskKind::Extract) {
    const pipeline::EvalTaskResult r = pipeline::eval_extract(a.opt);
    if (a.json) {
      print_json(r.extract.to_json(), a.task, r);
    } else {
      std::printf("records %lld  exact match %.4f  token F1 %.4f  %.0f input tokens/s  (%lld error records)\n",
                  static_cast<long long>(r.extract.n), r.extract.exact_match, r.extract.token_f1, r.run.tokens_per_s,
                  static_cast<long long>(r.run.errors));
    }
    return;
  }
  CORELM_CHECK(t.kind == pipeline::TaskKind::Classify, ValueError, "eval-task: --task must be classify or extract");
  const pipeline::EvalTaskResult r = pipeline::eval_classify(a.opt);
  const pipeline::ClassifyMetrics& m = r.metrics;
  if (a.json) {
    print_json(m.to_json(), a.task, r);
    return;
  }
  std::printf("records %lld  accuracy %.4f  macro-F1 %.4f  ECE(%d bins) %.4f  %.0f input tokens/s  (%lld error records)\n",
              static_cast<long long>(m.n), m.accuracy, m.macro_f1, m.bins, m.ece, r.run.tokens_per_s,
              static_cast<long long>(r.run.errors));
  std::printf("%-16s %9s %9s %9s %8s\n", "label", "precision", "recall", "f1", "support");
  for (size_t k = 0; k < m.labels.size(); ++k)
    std::printf("%-16s %9.4f %9.4f %9.4f %8lld\n", m.labels[k].c_str(), m.precision[k], m.recall[k], m.f1[k],
                static_cast<long long>(m.support[k]));
  std::printf("confusion (rows: gold, columns: predicted, in --labels order)\n");
  for (size_t g = 0; g < m.labels.size(); ++g) {
    std::printf("%-16s", m.labels[g].c_str());
    for (size_t p = 0; p < m.labels.size(); ++p) std::printf(" %7lld", static_cast<long long>(m.confusion[g][p]));
    std::printf("\n");
  }
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<EvalTaskArgs>();
  CLI::App* c = root.add_subcommand("eval-task", "Score a task on labelled JSONL: accuracy, macro-F1, confusion, ECE (classify); exact match, token F1 or entity F1 (extract)");
  pipeline::RunOptions& o = a->opt.run;
  pipeline::TaskSpec& t = o.task;
  c->add_option("--model", o.model, "model directory, HF folder or GGUF")->required();
  c->add_option("--data", o.inputs, "labelled JSONL files (.gz/.zst read transparently)")->required();
  c->add_option("--task", a->task, "classify | extract")->capture_default_str();
  c->add_option("--labels", t.labels, "classify: labels, comma-separated (every gold label must be one of them)")
      ->delimiter(',');
  c->add_option("--stop", t.stop, "extract: stop string (repeatable; \\n allowed)");
  c->add_option("--max-tokens", t.max_tokens, "extract: tokens to generate at most")->capture_default_str();
  c->add_option("--text-field", t.text_field, "field holding the text")->capture_default_str();
  c->add_option("--label-field", a->opt.label_field,
                "field holding the gold label (extract: the reference answer, a string or a list of strings; "
                "--entities: the entity list, default field 'entities')")
      ->capture_default_str()
      ->each([a](const std::string&) { a->label_field_given = true; });
  c->add_flag("--entities", a->entities,
              "extract: score entity spans; gold = list of {\"type\",\"text\"} or \"TYPE: text\", the output "
              "\"TYPE: text; TYPE: text\" or \"none\"");
  c->add_option("--template", t.template_text, "prompt template; {text} marks the document");
  c->add_option("--label-prefix", t.label_prefix, "each label is scored as the continuation PREFIX + label")
      ->capture_default_str();
  c->add_option("--out", o.out, "keep the run's output folder here (default: a temp folder, removed)");
  c->add_option("--precision", o.precision, "bf16 (default), int8, q4 or f32")->capture_default_str();
  c->add_option("--threads", o.threads, "threads")->capture_default_str();
  c->add_option("--batch", o.batch, "documents per forward")->capture_default_str();
  c->add_flag("--json", a->json, "print the metrics as one JSON line on stdout");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace corelm::cli
