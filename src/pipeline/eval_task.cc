// Task evaluation: the corpus runner labels the records (so evaluation measures exactly what
// `corelm run classify` produces, at its speed), then its part files are joined with the gold
// labels by the runner's FILE:LINE ids.
#include "corelm/eval_task.h"
#include "pipeline/engine.h"

#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "corelm/error.h"
#include "corelm/utf8.h"
#include "pipeline/f1.h"
#include "pipeline/input.h"
#include "pipeline/output_dir.h"

namespace corelm::pipeline {
namespace fs = std::filesystem;


ClassifyMetrics classify_metrics(const std::vector<std::string>& labels, const std::vector<int>& gold,
                                 const std::vector<int>& pred, const std::vector<double>& confidence, int bins) {
  CORELM_CHECK(!labels.empty(), ValueError, "classify metrics: no labels");
  CORELM_CHECK(gold.size() == pred.size() && gold.size() == confidence.size(), ValueError,
               "classify metrics: ", gold.size(), " gold labels, ", pred.size(), " predictions, ", confidence.size(),
               " confidences");
  CORELM_CHECK(bins >= 1, ValueError, "classify metrics: bins must be >= 1, got ", bins);
  const int L = static_cast<int>(labels.size());
  ClassifyMetrics m;
  m.labels = labels;
  m.bins = bins;
  m.n = static_cast<int64_t>(gold.size());
  m.confusion.assign(L, std::vector<int64_t>(L, 0));
  std::vector<double> bin_conf(bins, 0), bin_correct(bins, 0), bin_count(bins, 0);
  int64_t correct = 0;
  for (size_t i = 0; i < gold.size(); ++i) {
    CORELM_CHECK(gold[i] >= 0 && gold[i] < L && pred[i] >= 0 && pred[i] < L, ValueError,
                 "classify metrics: record ", i, ": label index outside the ", L, " labels");
    const double c = confidence[i];
    CORELM_CHECK(c >= 0 && c <= 1, ValueError, "classify metrics: record ", i, ": confidence ", c, " outside [0, 1]");
    ++m.confusion[gold[i]][pred[i]];
    const bool ok = gold[i] == pred[i];
    correct += ok;
    const int b = std::clamp(static_cast<int>(std::ceil(c * bins)) - 1, 0, bins - 1);
    bin_conf[b] += c;
    bin_correct[b] += ok;
    bin_count[b] += 1;
  }
  m.accuracy = m.n ? static_cast<double>(correct) / m.n : 0;
  for (int b = 0; b < bins; ++b)
    if (bin_count[b] > 0) m.ece += bin_count[b] / m.n * std::abs(bin_correct[b] / bin_count[b] - bin_conf[b] / bin_count[b]);
  m.precision.assign(L, 0);
  m.recall.assign(L, 0);
  m.f1.assign(L, 0);
  m.support.assign(L, 0);
  for (int k = 0; k < L; ++k) {
    int64_t predicted = 0;
    for (int g = 0; g < L; ++g) predicted += m.confusion[g][k];
    for (int p = 0; p < L; ++p) m.support[k] += m.confusion[k][p];
    const double tp = static_cast<double>(m.confusion[k][k]);
    m.precision[k] = predicted ? tp / predicted : 0;
    m.recall[k] = m.support[k] ? tp / m.support[k] : 0;
    m.f1[k] = f1_of(m.precision[k], m.recall[k]);
    m.macro_f1 += m.f1[k] / L;
  }
  return m;
}

nlohmann::ordered_json ClassifyMetrics::to_json() const {
  nlohmann::ordered_json j;
  j["records"] = n;
  j["accuracy"] = accuracy;
  j["macro_f1"] = macro_f1;
  j["ece"] = ece;
  j["ece_bins"] = bins;
  nlohmann::ordered_json per = nlohmann::ordered_json::object();
  for (size_t k = 0; k < labels.size(); ++k)
    per[labels[k]] = {{"precision", precision[k]}, {"recall", recall[k]}, {"f1", f1[k]}, {"support", support[k]}};
  j["per_label"] = per;
  nlohmann::ordered_json conf = nlohmann::ordered_json::object();
  for (size_t g = 0; g < labels.size(); ++g) {
    nlohmann::ordered_json row = nlohmann::ordered_json::object();
    for (size_t p = 0; p < labels.size(); ++p) row[labels[p]] = confusion[g][p];
    conf[labels[g]] = row;
  }
  j["confusion"] = conf;  // gold -> predicted -> count
  return j;
}

namespace {

// A folder removed when the evaluation ends (when the caller gave no --out).
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "corelm-eval-XXXXXX").string();
    CORELM_CHECK(::mkdtemp(tmpl.data()) != nullptr, IOError, "cannot create a temp folder in ",
                 fs::temp_directory_path().string());
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

namespace {

// The gold field of every record, by the id the runner gives it: FILE:LINE, FILE as given
// (escaped). Lines that are blank, too long or not a JSON object are the runner's error records.
std::map<std::string, nlohmann::json> read_gold(const RunOptions& o, const std::string& field) {
  CORELM_CHECK(!field.empty(), ValueError, "eval-task: --label-field is empty");
  CORELM_CHECK(o.task.id_field.empty(), ValueError,
               "eval-task: records are matched to their gold labels by FILE:LINE; --id-field is not supported");
  std::map<std::string, nlohmann::json> gold;
  for (const std::string& file : expand_inputs(o.inputs)) {
    LineReader reader(file, o.max_line_bytes);
    std::string line;
    bool too_long = false;
    while (reader.next(line, too_long)) {
      if (too_long || line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = escape_invalid_utf8(file) + ":" + std::to_string(reader.line_number());
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) continue;
      auto it = j.find(field);
      CORELM_CHECK(it != j.end(), ValueError, where, ": no gold label field '", field, "'");
      gold[where] = *it;
    }
  }
  CORELM_CHECK(!gold.empty(), ValueError, "eval-task: the data holds no labelled record");
  return gold;
}

// Runs the task into o.out (a temp folder when empty) and calls fn(record) for each output line.
template <typename Fn>
RunSummary run_and_read(RunOptions o, Fn fn) {
  std::unique_ptr<TempDir> temp;
  if (o.out.empty()) {
    temp = std::make_unique<TempDir>();
    o.out = temp->path + "/out";
  }
  RunSummary summary = run(o);
  CORELM_CHECK(summary.complete, IOError, "eval-task: the run over ", o.out, " is not complete");
  for (int64_t c = 0; c < summary.chunks_total; ++c) {
    const fs::path part = fs::path(o.out) / part_name(c);
    std::ifstream in(part);
    CORELM_CHECK(in.good(), IOError, "eval-task: ", part.string(), ": cannot open the run's output");
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) fn(nlohmann::json::parse(line));
  }
  return summary;
}

}  // namespace

EvalTaskResult eval_classify(const EvalTaskOptions& options) {
  RunOptions o = options.run;
  apply_model_task_defaults(o.task, o.model);  // a classification head's labels and template
  CORELM_CHECK(o.task.kind == TaskKind::Classify, ValueError, "eval_classify: the task is not classify");
  CORELM_CHECK(!o.task.labels.empty(), ValueError, "eval-task: --labels is required for classify");
  std::map<std::string, int> label_index;
  for (size_t k = 0; k < o.task.labels.size(); ++k) {
    CORELM_CHECK(label_index.emplace(o.task.labels[k], static_cast<int>(k)).second, ValueError,
                 "eval-task: label '", o.task.labels[k], "' is given twice in --labels");
  }
  std::map<std::string, int> gold_of;
  for (const auto& [where, v] : read_gold(o, options.label_field)) {
    std::string gold;
    if (v.is_string()) gold = v.get<std::string>();
    else if (v.is_number_integer()) gold = std::to_string(v.get<int64_t>());
    else throw ValueError(where + ": gold label field '" + options.label_field + "' must be a string or an integer");
    auto k = label_index.find(gold);
    CORELM_CHECK(k != label_index.end(), ValueError, where, ": gold label '", escape_invalid_utf8(gold),
                 "' is not one of --labels");
    gold_of[where] = k->second;
  }
  EvalTaskResult r;
  std::vector<int> gold, pred;
  std::vector<double> conf;
  r.run = run_and_read(o, [&](const nlohmann::json& j) {
    auto g = gold_of.find(j.at("id").get<std::string>());
    if (g == gold_of.end()) return;
    const std::string label = j.at("label").get<std::string>();
    gold.push_back(g->second);
    pred.push_back(label_index.at(label));
    conf.push_back(std::clamp(j.at("probs").at(label).get<double>(), 0.0, 1.0));
  });
  r.metrics = classify_metrics(o.task.labels, gold, pred, conf);
  return r;
}

namespace {

EvalTaskResult eval_entities(const EvalTaskOptions& options) {
  const RunOptions& o = options.run;
  std::map<std::string, std::vector<Entity>> gold_of;
  for (const auto& [where, v] : read_gold(o, options.label_field))
    gold_of[where] = entities_from_json(v, where, options.label_field);
  EvalTaskResult r;
  std::vector<std::vector<Entity>> preds, golds;
  int64_t malformed = 0;
  r.run = run_and_read(o, [&](const nlohmann::json& j) {
    auto g = gold_of.find(j.at("id").get<std::string>());
    if (g == gold_of.end()) return;
    preds.push_back(parse_entities(j.value("text", std::string()), &malformed));
    golds.push_back(g->second);
  });
  r.entities = entity_metrics(preds, golds, malformed);
  return r;
}

}  // namespace

EvalTaskResult eval_extract(const EvalTaskOptions& options) {
  const RunOptions& o = options.run;
  CORELM_CHECK(o.task.kind == TaskKind::Extract, ValueError, "eval_extract: the task is not extract");
  if (options.extract_metric == ExtractMetric::Entities) return eval_entities(options);
  std::map<std::string, std::vector<std::string>> refs_of;
  for (const auto& [where, v] : read_gold(o, options.label_field)) {
    std::vector<std::string> refs;
    if (v.is_string()) refs.push_back(v.get<std::string>());
    else if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_string(); }))
      for (const auto& e : v) refs.push_back(e.get<std::string>());
    else
      throw ValueError(where + ": reference field '" + options.label_field +
                       "' must be a string or a non-empty list of strings");
    refs_of[where] = std::move(refs);
  }
  EvalTaskResult r;
  std::vector<std::string> preds;
  std::vector<std::vector<std::string>> refs;
  r.run = run_and_read(o, [&](const nlohmann::json& j) {
    auto g = refs_of.find(j.at("id").get<std::string>());
    if (g == refs_of.end()) return;
    preds.push_back(j.value("text", std::string()));
    refs.push_back(g->second);
  });
  r.extract = extract_metrics(preds, refs);
  return r;
}

std::string normalize_answer(const std::string& s) {
  std::string lower;
  for (unsigned char c : s) {
    if (std::ispunct(c)) continue;  // ASCII punctuation only; other bytes are kept as they are
    lower += static_cast<char>(std::tolower(c));
  }
  std::istringstream words(lower);
  std::string w, out;
  while (words >> w) {
    if (w == "a" || w == "an" || w == "the") continue;
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

double token_f1(const std::string& prediction, const std::string& reference) {
  std::istringstream p(normalize_answer(prediction)), r(normalize_answer(reference));
  std::map<std::string, int64_t> pc, rc;
  int64_t np = 0, nr = 0;
  for (std::string w; p >> w; ++np) ++pc[w];
  for (std::string w; r >> w; ++nr) ++rc[w];
  if (np == 0 || nr == 0) return np == nr ? 1.0 : 0.0;
  int64_t common = 0;
  for (const auto& [w, c] : pc) {
    auto it = rc.find(w);
    if (it != rc.end()) common += std::min(c, it->second);
  }
  return f1_of(static_cast<double>(common) / np, static_cast<double>(common) / nr);
}

ExtractMetrics extract_metrics(const std::vector<std::string>& predictions,
                               const std::vector<std::vector<std::string>>& references) {
  CORELM_CHECK(predictions.size() == references.size(), ValueError, "extract metrics: ", predictions.size(),
               " predictions but ", references.size(), " reference sets");
  ExtractMetrics m;
  m.n = static_cast<int64_t>(predictions.size());
  for (size_t i = 0; i < predictions.size(); ++i) {
    CORELM_CHECK(!references[i].empty(), ValueError, "extract metrics: record ", i, " has no reference");
    double em = 0, f1 = 0;
    const std::string p = normalize_answer(predictions[i]);
    for (const std::string& ref : references[i]) {
      em = std::max(em, p == normalize_answer(ref) ? 1.0 : 0.0);
      f1 = std::max(f1, token_f1(predictions[i], ref));
    }
    m.exact_match += em;
    m.token_f1 += f1;
  }
  if (m.n) {
    m.exact_match /= m.n;
    m.token_f1 /= m.n;
  }
  return m;
}

nlohmann::ordered_json ExtractMetrics::to_json() const {
  nlohmann::ordered_json j;
  j["records"] = n;
  j["exact_match"] = exact_match;
  j["token_f1"] = token_f1;
  return j;
}

}  // namespace corelm::pipeline
