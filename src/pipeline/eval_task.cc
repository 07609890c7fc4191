// Task evaluation: the corpus runner labels the records (so evaluation measures exactly what
// `corelm run classify` produces, at its speed), then its part files are joined with the gold
// labels by the runner's FILE:LINE ids.
#include "corelm/eval_task.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "corelm/error.h"
#include "corelm/utf8.h"
#include "pipeline/input.h"

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
    m.f1[k] = m.precision[k] + m.recall[k] > 0 ? 2 * m.precision[k] * m.recall[k] / (m.precision[k] + m.recall[k]) : 0;
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

std::vector<fs::path> files_with(const std::string& dir, const std::string& stem) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with(stem) && n.ends_with(".jsonl")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

EvalTaskResult eval_classify(const EvalTaskOptions& options) {
  RunOptions o = options.run;
  CORELM_CHECK(o.task.kind == TaskKind::Classify, ValueError, "eval-task: only --task classify is built so far");
  CORELM_CHECK(!o.task.labels.empty(), ValueError, "eval-task: --labels is required for classify");
  CORELM_CHECK(o.task.id_field.empty(), ValueError,
               "eval-task: records are matched to their gold labels by FILE:LINE; --id-field is not supported");
  CORELM_CHECK(!options.label_field.empty(), ValueError, "eval-task: --label-field is empty");
  std::map<std::string, int> label_index;
  for (size_t k = 0; k < o.task.labels.size(); ++k) {
    CORELM_CHECK(label_index.emplace(o.task.labels[k], static_cast<int>(k)).second, ValueError,
                 "eval-task: label '", o.task.labels[k], "' is given twice in --labels");
  }

  // Gold labels by the id the runner gives each record: FILE:LINE, FILE as given (escaped).
  std::map<std::string, int> gold_of;
  for (const std::string& file : expand_inputs(o.inputs)) {
    LineReader reader(file, o.max_line_bytes);
    std::string line;
    bool too_long = false;
    while (reader.next(line, too_long)) {
      if (too_long || line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = escape_invalid_utf8(file) + ":" + std::to_string(reader.line_number());
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) continue;  // the runner reports it as an error record
      auto it = j.find(options.label_field);
      CORELM_CHECK(it != j.end(), ValueError, where, ": no gold label field '", options.label_field, "'");
      std::string gold;
      if (it->is_string()) gold = it->get<std::string>();
      else if (it->is_number_integer()) gold = std::to_string(it->get<int64_t>());
      else throw ValueError(where + ": gold label field '" + options.label_field + "' must be a string or an integer");
      auto k = label_index.find(gold);
      CORELM_CHECK(k != label_index.end(), ValueError, where, ": gold label '", escape_invalid_utf8(gold),
                   "' is not one of --labels");
      gold_of[where] = k->second;
    }
  }
  CORELM_CHECK(!gold_of.empty(), ValueError, "eval-task: the data holds no labelled record");

  std::unique_ptr<TempDir> temp;
  if (o.out.empty()) {
    temp = std::make_unique<TempDir>();
    o.out = temp->path + "/out";
  }
  EvalTaskResult r;
  r.run = run(o);
  CORELM_CHECK(r.run.complete, IOError, "eval-task: the run over ", o.out, " is not complete");
  std::vector<int> gold, pred;
  std::vector<double> conf;
  for (const fs::path& part : files_with(o.out, "part-")) {
    std::ifstream in(part);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line);
      auto g = gold_of.find(j.at("id").get<std::string>());
      if (g == gold_of.end()) continue;
      const std::string label = j.at("label").get<std::string>();
      gold.push_back(g->second);
      pred.push_back(label_index.at(label));
      conf.push_back(std::clamp(j.at("probs").at(label).get<double>(), 0.0, 1.0));
    }
  }
  r.error_records = r.run.errors;
  r.metrics = classify_metrics(o.task.labels, gold, pred, conf);
  return r;
}

}  // namespace corelm::pipeline
