// Task evaluation (`corelm eval-task`): run a task over labelled JSONL with the corpus runner and
// score its outputs against the gold field. Classification: accuracy, macro-F1, per-class
// precision/recall/F1, the confusion matrix and the expected calibration error of the predicted
// label's probability. Extraction: exact match and token F1 against a reference answer (or the
// best of several), after SQuAD-style normalisation; or, with ExtractMetric::Entities, CoNLL-style
// entity spans: micro and per-type precision/recall/F1 over (type, text) pairs.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "corelm/pipeline.h"

namespace corelm::pipeline {

struct ClassifyMetrics {
  std::vector<std::string> labels;
  int64_t n = 0;                 // scored records
  double accuracy = 0, macro_f1 = 0;
  double ece = 0;                // expected calibration error over `bins` equal-width bins
  int bins = 15;
  std::vector<double> precision, recall, f1;      // per label (0 where undefined)
  std::vector<int64_t> support;                    // gold count per label
  std::vector<std::vector<int64_t>> confusion;     // [gold][predicted]
  nlohmann::ordered_json to_json() const;
};

// gold[i], pred[i]: label indices; confidence[i]: the probability given to pred[i], in [0, 1].
// ECE = sum over bins b of |b|/n * |accuracy(b) - mean confidence(b)|, bin k holding
// confidences in (k/bins, (k+1)/bins] (0 goes to the first bin). Macro-F1 averages every label's
// F1, a label never predicted nor present counting 0. ValueError on mismatched sizes, an index
// outside the labels or a confidence outside [0, 1].
ClassifyMetrics classify_metrics(const std::vector<std::string>& labels, const std::vector<int>& gold,
                                 const std::vector<int>& pred, const std::vector<double>& confidence, int bins = 15);

struct ExtractMetrics {
  int64_t n = 0;
  double exact_match = 0, token_f1 = 0;  // means over records, each the best over its references
  nlohmann::ordered_json to_json() const;
};

// Lower case, ASCII punctuation removed, the articles a/an/the dropped, whitespace collapsed.
std::string normalize_answer(const std::string& s);
// Token F1 of two answers after normalize_answer (1 when both are empty, 0 when only one is).
double token_f1(const std::string& prediction, const std::string& reference);
ExtractMetrics extract_metrics(const std::vector<std::string>& predictions,
                               const std::vector<std::vector<std::string>>& references);

// One named entity: its type (upper case, e.g. PER) and its text (whitespace collapsed, trimmed;
// case kept, since entity text is copied from the sentence).
struct Entity {
  std::string type, text;
  auto operator<=>(const Entity&) const = default;
};

// The generated text of an entity extraction: entries "TYPE: text" separated by ';' or newlines
// ("PER: Peter Blackburn; LOC: BRUSSELS"). Lenient: the type is trimmed and upper-cased, the text
// split at the first ':' and normalised as in Entity; "none" (any case) or an empty text is no
// entity; an entry with no ':' or an empty type or text is skipped and counted in *malformed.
std::vector<Entity> parse_entities(const std::string& generated, int64_t* malformed = nullptr);

// Gold entities: a JSON list whose elements are {"type": T, "text": S} objects or "T: S" strings
// (an empty list: no entity). ValueError naming `where` (FILE:LINE) and `field` otherwise.
std::vector<Entity> entities_from_json(const nlohmann::json& gold, const std::string& where, const std::string& field);

struct EntityCounts {
  int64_t gold = 0, predicted = 0, correct = 0;
  double precision = 0, recall = 0, f1 = 0;  // 0 where undefined (nothing predicted / no gold)
};

struct EntityMetrics {
  int64_t n = 0;                 // scored records
  EntityCounts micro;            // over every record and type
  std::map<std::string, EntityCounts> per_type;  // every type seen in gold or predictions
  double exact_match = 0;        // records whose predicted multiset equals the gold one
  int64_t malformed = 0;         // prediction entries skipped by parse_entities
  nlohmann::ordered_json to_json() const;
};

// Per record, correct = the size of the multiset intersection of predicted and gold (type, text)
// pairs (a pair predicted twice but present once counts once). Precision = correct / predicted,
// recall = correct / gold, summed over records (micro) and per type. ValueError on mismatched sizes.
EntityMetrics entity_metrics(const std::vector<std::vector<Entity>>& predictions,
                             const std::vector<std::vector<Entity>>& gold, int64_t malformed = 0);

// What `eval-task --task extract` compares: a reference answer (exact match, token F1) or entity
// spans (--entities).
enum class ExtractMetric { Answer, Entities };

struct EvalTaskOptions {
  RunOptions run;                   // model, inputs, task (classify), batch, ...; out "" = a temp folder
  std::string label_field = "label";
  ExtractMetric extract_metric = ExtractMetric::Answer;
};

struct EvalTaskResult {
  ClassifyMetrics metrics;   // classify
  ExtractMetrics extract;    // extract, ExtractMetric::Answer
  EntityMetrics entities;    // extract, ExtractMetric::Entities
  RunSummary run;  // run.errors: records the runner could not score (too long, bad JSON), not in the metrics
};

// ValueError naming FILE:LINE for a record without a gold label or with one outside --labels, and
// for data without any labelled record.
EvalTaskResult eval_classify(const EvalTaskOptions& options);
// Extraction: the label field holds the reference answer, a string or a list of strings; with
// ExtractMetric::Entities, the gold entities (see entities_from_json) and the generated text is
// read by parse_entities.
EvalTaskResult eval_extract(const EvalTaskOptions& options);

}  // namespace corelm::pipeline
