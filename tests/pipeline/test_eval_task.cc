// corelm eval-task (issue 14, first slice): the classification metrics against an independent
// numpy computation (tests/pipeline/classify_metrics_oracle.py), and the end-to-end evaluation
// through the corpus runner with its negative cases (unknown gold label, missing label field,
// no labelled record, duplicate labels).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "corelm/error.h"
#include "corelm/eval_task.h"
#include "common/cli_runner.h"
#include "pipeline/pipeline_fixture.h"

namespace corelm::testing {
namespace {

std::string python_json(const std::string& script, const std::string& input_path) {
  const std::string cmd = std::string(CORELM_TEST_PYTHON) + " " + CORELM_SOURCE_DIR + "/tests/pipeline/" + script +
                          " < " + input_path;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  return ::pclose(p) == 0 ? out : "";
}

TEST(ClassifyMetrics, MatchNumpyOnRandomCases) {
  if (!fs::exists(CORELM_TEST_PYTHON)) GTEST_SKIP() << "no oracle python at " << CORELM_TEST_PYTHON << " (make test sets it up)";
  std::mt19937 rng(5);
  const fs::path dir = fs::temp_directory_path() / ("corelm_metrics_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (int c = 0; c < 12; ++c) {
    const int L = 2 + static_cast<int>(rng() % 5), n = 1 + static_cast<int>(rng() % 300);
    std::vector<std::string> labels;
    for (int k = 0; k < L; ++k) labels.push_back("l" + std::to_string(k));
    std::vector<int> gold(n), pred(n);
    std::vector<double> conf(n);
    for (int i = 0; i < n; ++i) {
      gold[i] = static_cast<int>(rng() % L);
      // Mostly right, sometimes a label no record has, confidences on bin edges now and then.
      pred[i] = rng() % 3 ? gold[i] : static_cast<int>(rng() % L);
      conf[i] = rng() % 7 == 0 ? static_cast<double>(rng() % 16) / 15.0 : std::uniform_real_distribution<double>(0, 1)(rng);
    }
    const auto m = pipeline::classify_metrics(labels, gold, pred, conf);
    const std::string in = (dir / "case.json").string();
    std::ofstream(in) << nlohmann::json{{"labels", L}, {"gold", gold}, {"pred", pred}, {"conf", conf}, {"bins", 15}}.dump();
    const std::string out = python_json("classify_metrics_oracle.py", in);
    ASSERT_FALSE(out.empty()) << "oracle failed";
    const auto want = nlohmann::json::parse(out);
    EXPECT_NEAR(m.accuracy, want["accuracy"].get<double>(), 1e-12) << c;
    EXPECT_NEAR(m.macro_f1, want["macro_f1"].get<double>(), 1e-12) << c;
    EXPECT_NEAR(m.ece, want["ece"].get<double>(), 1e-12) << c;
    for (int k = 0; k < L; ++k) {
      EXPECT_NEAR(m.precision[k], want["precision"][k].get<double>(), 1e-12) << c << " " << k;
      EXPECT_NEAR(m.recall[k], want["recall"][k].get<double>(), 1e-12) << c << " " << k;
      EXPECT_NEAR(m.f1[k], want["f1"][k].get<double>(), 1e-12) << c << " " << k;
      EXPECT_EQ(m.support[k], want["support"][k].get<int64_t>()) << c << " " << k;
      for (int p = 0; p < L; ++p) EXPECT_EQ(m.confusion[k][p], want["confusion"][k][p].get<int64_t>());
    }
  }
  fs::remove_all(dir);
}

TEST(ClassifyMetrics, PerfectCalibratedAndBadInputs) {
  const std::vector<std::string> labels{"a", "b"};
  auto m = pipeline::classify_metrics(labels, {0, 1, 1}, {0, 1, 1}, {1.0, 1.0, 1.0});
  EXPECT_DOUBLE_EQ(m.accuracy, 1.0);
  EXPECT_DOUBLE_EQ(m.macro_f1, 1.0);
  EXPECT_DOUBLE_EQ(m.ece, 0.0);
  // Always "a" with full confidence on half-"b" data: ECE is the error rate.
  m = pipeline::classify_metrics(labels, {0, 1, 0, 1}, {0, 0, 0, 0}, {1, 1, 1, 1});
  EXPECT_DOUBLE_EQ(m.ece, 0.5);
  EXPECT_DOUBLE_EQ(m.f1[1], 0.0);
  EXPECT_THROW(pipeline::classify_metrics(labels, {0}, {0, 1}, {1, 1}), ValueError);
  EXPECT_THROW(pipeline::classify_metrics(labels, {2}, {0}, {1}), ValueError);
  EXPECT_THROW(pipeline::classify_metrics(labels, {0}, {0}, {1.5}), ValueError);
}

TEST(ExtractMetrics, MatchAnIndependentSquadStyleComputation) {
  if (!fs::exists(CORELM_TEST_PYTHON)) GTEST_SKIP() << "no oracle python at " << CORELM_TEST_PYTHON << " (make test sets it up)";
  std::mt19937 rng(9);
  const std::vector<std::string> vocab = {"The", "cat", "a", "Cat", "an", "mat", "sat,", "on", "the", "dog!", "New",
                                          "York", "york.", "(UN)", "un", "  ", "3.5", "x"};
  auto phrase = [&] {
    std::string s;
    for (int k = 0, n = static_cast<int>(rng() % 5); k < n; ++k) s += (k ? " " : "") + vocab[rng() % vocab.size()];
    return s;
  };
  std::vector<std::string> preds;
  std::vector<std::vector<std::string>> refs;
  nlohmann::json pairs = nlohmann::json::array();
  for (int i = 0; i < 400; ++i) {
    preds.push_back(phrase());
    refs.push_back({phrase()});
    if (rng() % 3 == 0) refs.back().push_back(rng() % 2 ? preds.back() + "." : phrase());
    pairs.push_back({preds.back(), refs.back()});
  }
  const fs::path dir = fs::temp_directory_path() / ("corelm_extract_metrics_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string in = (dir / "pairs.json").string();
  std::ofstream(in) << nlohmann::json{{"pairs", pairs}}.dump();
  const std::string out = python_json("extract_metrics_oracle.py", in);
  fs::remove_all(dir);
  ASSERT_FALSE(out.empty()) << "oracle failed";
  const auto want = nlohmann::json::parse(out);
  double em = 0, f1 = 0;
  for (size_t i = 0; i < preds.size(); ++i) {
    const auto one = pipeline::extract_metrics({preds[i]}, {refs[i]});
    EXPECT_NEAR(one.exact_match, want[i][0].get<double>(), 1e-12) << preds[i] << " | " << refs[i][0];
    EXPECT_NEAR(one.token_f1, want[i][1].get<double>(), 1e-12) << preds[i] << " | " << refs[i][0];
    em += want[i][0].get<double>();
    f1 += want[i][1].get<double>();
  }
  const auto all = pipeline::extract_metrics(preds, refs);
  EXPECT_NEAR(all.exact_match, em / preds.size(), 1e-12);
  EXPECT_NEAR(all.token_f1, f1 / preds.size(), 1e-12);
  EXPECT_GT(all.exact_match, 0.0) << "the cases should include matches";
  EXPECT_THROW(pipeline::extract_metrics({"a"}, {}), ValueError);
}

class EvalTaskTest : public PipelineTest {
 protected:
  pipeline::EvalTaskOptions options(const std::string& data) const {
    pipeline::EvalTaskOptions o;
    o.run = classify_options(data, "");
    o.run.task.labels = {"sports", "business"};
    return o;
  }
};

TEST_F(EvalTaskTest, ScoresWhatRunClassifyProduces) {
  std::mt19937 rng(3);
  std::string data;
  for (int i = 0; i < 50; ++i)
    data += nlohmann::json{{"text", words(rng, 6)}, {"label", i % 3 ? "sports" : "business"}}.dump() + "\n";
  write_text(path("data.jsonl"), data);
  auto o = options(path("data.jsonl"));
  o.run.out = path("kept");
  const auto r = pipeline::eval_classify(o);
  EXPECT_EQ(r.metrics.n, 50);
  EXPECT_EQ(r.metrics.support[0] + r.metrics.support[1], 50);
  EXPECT_EQ(r.metrics.support[1], 17);
  // The predictions are the run's own labels, record by record.
  const auto out = parse_lines(read_parts(path("kept")));
  ASSERT_EQ(out.size(), 50u);
  int64_t predicted_sports = 0;
  for (const auto& j : out) predicted_sports += j["label"] == "sports";
  EXPECT_EQ(r.metrics.confusion[0][0] + r.metrics.confusion[1][0], predicted_sports);
  EXPECT_GE(r.metrics.ece, 0.0);
  EXPECT_LE(r.metrics.ece, 1.0);
}

TEST_F(EvalTaskTest, BadGoldLabelsAndEmptyDataAreErrorsNamingTheLine) {
  write_text(path("unknown.jsonl"), "{\"text\": \"a b\", \"label\": \"sports\"}\n{\"text\": \"c\", \"label\": \"world\"}\n");
  try {
    pipeline::eval_classify(options(path("unknown.jsonl")));
    ADD_FAILURE() << "an unknown gold label passed";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown.jsonl:2: gold label 'world' is not one of --labels"), std::string::npos)
        << e.what();
  }
  write_text(path("nolabel.jsonl"), "{\"text\": \"a b\"}\n");
  EXPECT_THROW(pipeline::eval_classify(options(path("nolabel.jsonl"))), ValueError);
  write_text(path("empty.jsonl"), "\n\n");
  try {
    pipeline::eval_classify(options(path("empty.jsonl")));
    ADD_FAILURE() << "empty data passed";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no labelled record"), std::string::npos) << e.what();
  }
  auto dup = options(path("unknown.jsonl"));
  dup.run.task.labels = {"sports", "sports"};
  EXPECT_THROW(pipeline::eval_classify(dup), ValueError);
}

}  // namespace
}  // namespace corelm::testing

namespace corelm::testing {
namespace {

TEST_F(EvalTaskTest, ExtractScoresTheGeneratedAnswersAndRefusesBadReferences) {
  std::mt19937 rng(4);
  std::string data;
  for (int i = 0; i < 12; ++i)
    data += nlohmann::json{{"text", words(rng, 5)}, {"label", i % 2 ? nlohmann::json("yes") : nlohmann::json({"no", "yes no"})}}
                .dump() + "\n";
  write_text(path("ex.jsonl"), data);
  pipeline::EvalTaskOptions o;
  o.run = classify_options(path("ex.jsonl"), path("kept"));
  o.run.task.kind = pipeline::TaskKind::Extract;
  o.run.task.labels.clear();
  o.run.task.max_tokens = 3;
  const auto r = pipeline::eval_extract(o);
  EXPECT_EQ(r.extract.n, 12);
  // The metrics are those of the run's own outputs against the references.
  std::vector<std::string> preds;
  std::vector<std::vector<std::string>> refs;
  for (const auto& j : parse_lines(read_parts(path("kept")))) {
    const int line = std::stoi(j["id"].get<std::string>().substr(j["id"].get<std::string>().rfind(':') + 1));
    preds.push_back(j["text"].get<std::string>());
    refs.push_back(line % 2 ? std::vector<std::string>{"no", "yes no"} : std::vector<std::string>{"yes"});
  }
  const auto want = pipeline::extract_metrics(preds, refs);
  EXPECT_DOUBLE_EQ(r.extract.exact_match, want.exact_match);
  EXPECT_DOUBLE_EQ(r.extract.token_f1, want.token_f1);

  write_text(path("badref.jsonl"), "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\", \"label\": 3}\n");
  o.run.inputs = {path("badref.jsonl")};
  o.run.out = "";
  try {
    pipeline::eval_extract(o);
    ADD_FAILURE() << "a numeric reference passed";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("badref.jsonl:2: reference field 'label'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace corelm::testing

// Entity spans (`eval-task --task extract --entities`): the metrics against conlleval-style chunks
// read from IOB2 tags by tests/pipeline/entity_metrics_oracle.py, the lenient parse of generated
// text, and malformed gold named by FILE:LINE.
namespace corelm::testing {
namespace {

struct Span {
  int start, end;  // token range, end exclusive
  std::string type;
};

TEST(EntityMetrics, MatchConllevalChunksFromIobTags) {
  if (!fs::exists(CORELM_TEST_PYTHON)) GTEST_SKIP() << "no oracle python at " << CORELM_TEST_PYTHON << " (make test sets it up)";
  std::mt19937 rng(14);
  const std::vector<std::string> types = {"PER", "LOC", "ORG", "MISC"};
  const std::vector<std::string> stems = {"Peter", "BRUSSELS", "eu", "Blackburn", "New", "York", "of", "Reuters", "x"};
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::vector<pipeline::Entity>> golds, preds;
  int64_t garbage = 0;
  for (int s = 0; s < 300; ++s) {
    const int n = pick(16);
    // Tokens unique within the sentence, so that comparing (type, text) pairs is comparing spans.
    std::vector<std::string> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(stems[pick(stems.size())] + std::to_string(i));
    auto text_of = [&](const Span& sp) {
      std::string t;
      for (int i = sp.start; i < sp.end; ++i) t += (i > sp.start ? (pick(4) ? " " : "  \t") : "") + tokens[i];
      return t;
    };
    std::vector<Span> gold;
    for (int i = 0; i < n;) {
      if (pick(3) == 0) {
        const int len = 1 + pick(3), end = std::min(n, i + len);
        gold.push_back({i, end, types[pick(4)]});
        i = end;
      } else {
        ++i;
      }
    }
    // Predictions: kept, retyped, resized or dropped gold spans plus spurious ones, laid
    // without overlap (a span clashing with an earlier one is left out).
    std::vector<Span> wanted;
    for (const Span& g : gold) {
      const int r = pick(10);
      if (r < 5) wanted.push_back(g);
      else if (r == 5) wanted.push_back({g.start, g.end, types[pick(4)]});
      else if (r == 6) wanted.push_back({g.start, std::min(n, g.end + 1), g.type});
      else if (r == 7 && g.end - g.start > 1) wanted.push_back({g.start + 1, g.end, g.type});
    }
    if (n > 0 && pick(3) == 0) {
      const int st = pick(n);
      wanted.push_back({st, std::min(n, st + 1 + pick(2)), types[pick(4)]});
    }
    std::vector<int> taken(n, 0);
    std::vector<Span> pred;
    for (const Span& w : wanted) {
      bool free = true;
      for (int i = w.start; i < w.end; ++i) free = free && !taken[i];
      if (!free) continue;
      for (int i = w.start; i < w.end; ++i) taken[i] = 1;
      pred.push_back(w);
    }
    auto tags = [&](const std::vector<Span>& spans) {
      std::vector<std::string> t(n, "O");
      for (const Span& sp : spans)
        for (int i = sp.start; i < sp.end; ++i) t[i] = (i == sp.start ? "B-" : "I-") + sp.type;
      return t;
    };
    cases.push_back({{"tokens", tokens}, {"gold", tags(gold)}, {"pred", tags(pred)}});
    // Gold as JSON, objects and "TYPE: text" strings mixed.
    nlohmann::json gj = nlohmann::json::array();
    for (const Span& g : gold) {
      if (pick(2)) gj.push_back({{"type", g.type}, {"text", text_of(g)}});
      else gj.push_back(g.type + ": " + text_of(g));
    }
    golds.push_back(pipeline::entities_from_json(gj, "case:" + std::to_string(s), "entities"));
    // The generated text, formatted loosely: type case, separators, spaces, "none", junk entries.
    std::string out;
    const std::vector<std::string> seps = {"; ", ";", "\n", " ;  "};
    for (size_t k = 0; k < pred.size(); ++k) {
      std::string type = pred[k].type;
      if (pick(3) == 0) type[1] = static_cast<char>(std::tolower(type[1]));
      if (pick(4) == 0) type = " " + type + " ";
      if (k) out += seps[pick(seps.size())];
      out += type + (pick(2) ? ": " : ":") + text_of(pred[k]);
      if (pick(8) == 0) {
        out += "; garbage";
        ++garbage;
      }
    }
    if (pred.empty()) out = std::vector<std::string>{"none", "None", "", " NONE "}[pick(4)];
    int64_t bad = 0;
    preds.push_back(pipeline::parse_entities(out, &bad));
    ASSERT_EQ(preds.back().size(), pred.size()) << out;
    garbage -= bad;
  }
  EXPECT_EQ(garbage, 0) << "every junk entry, and only those, is counted as malformed";
  const auto m = pipeline::entity_metrics(preds, golds);
  const fs::path dir = fs::temp_directory_path() / ("corelm_entity_metrics_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string in = (dir / "cases.json").string();
  std::ofstream(in) << nlohmann::json{{"cases", cases}}.dump();
  const std::string out = python_json("entity_metrics_oracle.py", in);
  fs::remove_all(dir);
  ASSERT_FALSE(out.empty()) << "oracle failed";
  const auto want = nlohmann::json::parse(out);
  EXPECT_NEAR(m.micro.precision, want["precision"].get<double>(), 1e-12);
  EXPECT_NEAR(m.micro.recall, want["recall"].get<double>(), 1e-12);
  EXPECT_NEAR(m.micro.f1, want["f1"].get<double>(), 1e-12);
  EXPECT_EQ(m.micro.gold, want["gold"].get<int64_t>());
  EXPECT_EQ(m.micro.predicted, want["predicted"].get<int64_t>());
  EXPECT_EQ(m.micro.correct, want["correct"].get<int64_t>());
  EXPECT_NEAR(m.exact_match, want["exact_match"].get<double>(), 1e-12);
  ASSERT_EQ(m.per_type.size(), want["per_type"].size());
  for (const auto& [type, c] : m.per_type) {
    const auto& w = want["per_type"][type];
    EXPECT_NEAR(c.precision, w["precision"].get<double>(), 1e-12) << type;
    EXPECT_NEAR(c.recall, w["recall"].get<double>(), 1e-12) << type;
    EXPECT_NEAR(c.f1, w["f1"].get<double>(), 1e-12) << type;
    EXPECT_EQ(c.correct, w["correct"].get<int64_t>()) << type;
  }
  EXPECT_GT(m.micro.correct, 0);
  EXPECT_LT(m.micro.correct, m.micro.gold) << "the cases should include misses";
}

TEST(EntityMetrics, MultisetsAndEdgeCases) {
  using E = pipeline::Entity;
  // A pair predicted twice but present once counts once; the type is upper-cased, text spaces collapsed.
  auto m = pipeline::entity_metrics({pipeline::parse_entities("per: Peter  Blackburn; PER: Peter Blackburn")},
                                    {{E{"PER", "Peter Blackburn"}}});
  EXPECT_EQ(m.micro.correct, 1);
  EXPECT_EQ(m.micro.predicted, 2);
  EXPECT_DOUBLE_EQ(m.micro.precision, 0.5);
  EXPECT_DOUBLE_EQ(m.micro.recall, 1.0);
  EXPECT_DOUBLE_EQ(m.exact_match, 0.0);
  // Text case is kept: "brussels" is not "BRUSSELS".
  m = pipeline::entity_metrics({pipeline::parse_entities("LOC: brussels")}, {{E{"LOC", "BRUSSELS"}}});
  EXPECT_EQ(m.micro.correct, 0);
  // No gold and nothing predicted: an exact match, precision/recall/F1 0 (undefined).
  m = pipeline::entity_metrics({pipeline::parse_entities("none")}, {{}});
  EXPECT_DOUBLE_EQ(m.exact_match, 1.0);
  EXPECT_DOUBLE_EQ(m.micro.f1, 0.0);
  int64_t bad = 0;
  EXPECT_TRUE(pipeline::parse_entities(": x; PER:; LOC", &bad).empty());
  EXPECT_EQ(bad, 3);
  // The text is split at the first ':' only.
  const auto e = pipeline::parse_entities("MISC: Re: Trade");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "Re: Trade");
  EXPECT_THROW(pipeline::entity_metrics({{}}, {}), ValueError);
}

TEST_F(EvalTaskTest, EntitiesScoreTheGeneratedTextAndRefuseMalformedGold) {
  std::mt19937 rng(8);
  std::string data;
  for (int i = 0; i < 10; ++i) {
    nlohmann::json ents = nlohmann::json::array();
    if (i % 3) ents.push_back({{"type", "PER"}, {"text", "sat"}});
    if (i % 2) ents.push_back("LOC: the mat");
    data += nlohmann::json{{"text", words(rng, 5)}, {"entities", ents}}.dump() + "\n";
  }
  write_text(path("ents.jsonl"), data);
  pipeline::EvalTaskOptions o;
  o.run = classify_options(path("ents.jsonl"), path("kept"));
  o.run.task.kind = pipeline::TaskKind::Extract;
  o.run.task.labels.clear();
  o.run.task.max_tokens = 4;
  o.label_field = "entities";
  o.extract_metric = pipeline::ExtractMetric::Entities;
  const auto r = pipeline::eval_extract(o);
  EXPECT_EQ(r.entities.n, 10);
  EXPECT_EQ(r.entities.micro.gold, 6 + 5);
  // The metrics are those of the run's own generated texts against the gold lists.
  std::vector<std::vector<pipeline::Entity>> preds, golds;
  int64_t bad = 0;
  for (const auto& j : parse_lines(read_parts(path("kept")))) {
    const std::string id = j["id"].get<std::string>();
    const int line = std::stoi(id.substr(id.rfind(':') + 1));
    preds.push_back(pipeline::parse_entities(j["text"].get<std::string>(), &bad));
    std::vector<pipeline::Entity> g;
    if ((line - 1) % 3) g.push_back({"PER", "sat"});
    if ((line - 1) % 2) g.push_back({"LOC", "the mat"});
    golds.push_back(g);
  }
  const auto want = pipeline::entity_metrics(preds, golds, bad);
  EXPECT_EQ(r.entities.micro.predicted, want.micro.predicted);
  EXPECT_EQ(r.entities.micro.correct, want.micro.correct);
  EXPECT_EQ(r.entities.malformed, want.malformed);
  EXPECT_DOUBLE_EQ(r.entities.exact_match, want.exact_match);

  const std::vector<std::pair<std::string, std::string>> bad_gold = {
      {"\"PER: Peter\"", "must be a list"},
      {"[{\"type\": \"PER\"}]", "element 0: an object needs string fields"},
      {"[\"PER: a\", \"Peter\"]", "element 1: 'Peter' is not \"TYPE: text\""},
      {"[\" : x\"]", "element 0: ' : x' is not"},
      {"[{\"type\": \"PER\", \"text\": \"  \"}]", "element 0: empty type or text"},
      {"[7]", "element 0: must be an object or a string"},
  };
  o.run.out = "";
  for (size_t k = 0; k < bad_gold.size(); ++k) {
    const std::string file = path("bad" + std::to_string(k) + ".jsonl");
    write_text(file, "{\"text\": \"a b\", \"entities\": []}\n\n{\"text\": \"c\", \"entities\": " + bad_gold[k].first + "}\n");
    o.run.inputs = {file};
    try {
      pipeline::eval_extract(o);
      ADD_FAILURE() << "malformed gold passed: " << bad_gold[k].first;
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("bad" + std::to_string(k) + ".jsonl:3: entity field 'entities'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad_gold[k].second), std::string::npos) << msg;
    }
  }
  // A record without the field at all.
  write_text(path("nofield.jsonl"), "{\"text\": \"a b\"}\n");
  o.run.inputs = {path("nofield.jsonl")};
  EXPECT_THROW(pipeline::eval_extract(o), ValueError);
}

}  // namespace
}  // namespace corelm::testing

// bench/task_data.py (the task table's data prep) on a tiny synthetic copy of each source format,
// and bench/conll_baseline.py on the converted CoNLL sample.
namespace corelm::testing {
namespace {

std::vector<nlohmann::json> jsonl(const fs::path& p) { return parse_lines(slurp(p)); }

TEST(TaskData, ConvertsTinySamplesOfEverySourceFormat) {
  if (!have_program("python3")) GTEST_SKIP() << "python3 not found";
  const fs::path root = fs::temp_directory_path() / ("corelm_task_data_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = root / "data", out = root / "out";
  fs::create_directories(data / "classification/ag_news");
  fs::create_directories(data / "classification/sst2");
  fs::create_directories(data / "classification/trec");
  fs::create_directories(data / "extraction/conll2003");
  write_text((data / "classification/ag_news/classes.txt").string(), "World\nSports\nBusiness\nSci/Tech\n");
  std::string ag = "label,content\n";
  for (int i = 0; i < 40; ++i) ag += std::to_string(1 + i / 10) + ",\"row " + std::to_string(i) + " a\\\\line,  two\"\n";
  write_text((data / "classification/ag_news/train_subset_8k.csv").string(), ag);
  write_text((data / "classification/ag_news/test_description_only.csv").string(), "label,content\n4,\"chips \\\\ faster\"\n2,game\n");
  std::string sst = "label\tsentence\n";
  for (int i = 0; i < 20; ++i) sst += std::to_string(i % 2) + "\tphrase " + std::to_string(i) + " ,\n";
  write_text((data / "classification/sst2/train.tsv").string(), sst);
  write_text((data / "classification/sst2/test.tsv").string(), "label\tcontent\n1\tgood \" film\n0\tbad\n");
  write_text((data / "classification/sst2/dev.tsv").string(), "label\tcontent\n0\tdull\n1\tfine film\n0\tslow\n");
  std::string trec;
  for (int i = 0; i < 30; ++i) trec += std::string(i % 2 ? "HUM:ind" : "NUM:dist") + " Who is " + std::to_string(i) + " ?\n";
  write_text((data / "classification/trec/train_5500.label").string(), trec);
  write_text((data / "classification/trec/TREC_10.label").string(), "LOC:city Where is Aspen ?\n\nABBR:exp What is EU ?\n");
  // Adjacent B- chunks, an I- that starts a chunk (IOB1 style), a chunk at the sentence end.
  const std::string conll =
      "EU\tB-ORG\nrejects\tO\nGerman\tB-MISC\nBritish\tB-MISC\nlamb\tO\n\n"
      "Peter\tI-PER\nBlackburn\tI-PER\nin\tO\nNew\tB-LOC\nYork\tI-LOC\n\n\n";
  for (const char* f : {"train", "valid", "test"}) write_text((data / "extraction/conll2003" / (std::string(f) + ".tsv")).string(), conll);

  const std::string script = std::string(CORELM_SOURCE_DIR) + "/bench/task_data.py";
  auto r = run_program("python3", {script, "--data", data.string(), "--out", out.string()}, CliOptions{.timeout_s = 30});
  ASSERT_EQ(r.rc, 0) << r.all();
  auto ag_train = jsonl(out / "agnews/train.jsonl"), ag_dev = jsonl(out / "agnews/dev.jsonl");
  EXPECT_EQ(ag_train.size(), 36u);
  EXPECT_EQ(ag_dev.size(), 4u);  // 10 % held out, never in train
  for (const auto& d : ag_dev)
    for (const auto& t : ag_train) EXPECT_NE(d["text"], t["text"]);
  EXPECT_NE(ag_train[0]["text"], "row 0 a line, two") << "the class-sorted file is shuffled";
  const auto ag_test = jsonl(out / "agnews/test.jsonl");
  ASSERT_EQ(ag_test.size(), 2u);
  EXPECT_EQ(ag_test[0], (nlohmann::json{{"text", "chips faster"}, {"label", "Sci/Tech"}}));
  EXPECT_EQ(slurp(out / "agnews/labels.txt"), "World\nSports\nBusiness\nSci/Tech\n");
  const auto sst_test = jsonl(out / "sst2/test.jsonl");
  ASSERT_EQ(sst_test.size(), 2u);
  EXPECT_EQ(sst_test[0], (nlohmann::json{{"text", "good \" film"}, {"label", "positive"}}));
  // SST-2's dev is the GLUE dev.tsv by default (whole sentences; train keeps all 20 phrases) ...
  EXPECT_EQ(jsonl(out / "sst2/train.jsonl").size(), 20u);
  const auto sst_dev = jsonl(out / "sst2/dev.jsonl");
  ASSERT_EQ(sst_dev.size(), 3u);
  EXPECT_EQ(sst_dev[1], (nlohmann::json{{"text", "fine film"}, {"label", "positive"}}));
  // ... or 10 % of train.tsv with --sst2-dev split.
  r = run_program("python3", {script, "--data", data.string(), "--out", (root / "out_split").string(), "--sets", "sst2",
                              "--sst2-dev", "split"}, CliOptions{.timeout_s = 30});
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_EQ(jsonl(root / "out_split/sst2/train.jsonl").size(), 18u);
  EXPECT_EQ(jsonl(root / "out_split/sst2/dev.jsonl").size(), 2u);
  const auto trec_test = jsonl(out / "trec/test.jsonl");
  ASSERT_EQ(trec_test.size(), 2u);
  EXPECT_EQ(trec_test[1], (nlohmann::json{{"text", "What is EU ?"}, {"label", "abbreviation"}}));
  EXPECT_EQ(jsonl(out / "trec/dev.jsonl").size(), 3u);
  const auto conll_test = jsonl(out / "conll/test.jsonl");
  ASSERT_EQ(conll_test.size(), 2u);
  EXPECT_EQ(conll_test[0]["text"], "EU rejects German British lamb");
  const auto e0 = pipeline::entities_from_json(conll_test[0]["entities"], "t:1", "entities");
  const auto e1 = pipeline::entities_from_json(conll_test[1]["entities"], "t:2", "entities");
  EXPECT_EQ(e0, (std::vector<pipeline::Entity>{{"ORG", "EU"}, {"MISC", "German"}, {"MISC", "British"}}));
  EXPECT_EQ(e1, (std::vector<pipeline::Entity>{{"PER", "Peter Blackburn"}, {"LOC", "New York"}}));

  // The baseline tags its own training sentences perfectly (every entity is in its gazetteer).
  r = run_program("python3", {std::string(CORELM_SOURCE_DIR) + "/bench/conll_baseline.py", (out / "conll/train.jsonl").string(),
                              (out / "conll/test.jsonl").string(), (root / "bl").string()}, CliOptions{.timeout_s = 30});
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto bl = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(bl["f1"].get<double>(), 1.0) << r.out;
  const auto preds = jsonl(root / "bl/predictions.jsonl");
  ASSERT_EQ(preds.size(), 2u);
  EXPECT_EQ(pipeline::parse_entities(preds[1]["prediction"].get<std::string>()), e1);

  // A bad tag and a bad TREC line are errors naming the file and line.
  write_text((data / "extraction/conll2003/test.tsv").string(), "EU\tB-ORG\n\nrejects\tX-ORG\n");
  r = run_program("python3", {script, "--data", data.string(), "--out", out.string(), "--sets", "conll"}, CliOptions{.timeout_s = 30});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("test.tsv:3: bad IOB tag 'X-ORG'"), std::string::npos) << r.all();
  write_text((data / "classification/trec/TREC_10.label").string(), "LOC:city Where ?\nnolabel\n");
  r = run_program("python3", {script, "--data", data.string(), "--out", out.string(), "--sets", "trec"}, CliOptions{.timeout_s = 30});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("TREC_10.label:2: expected 'COARSE:fine question'"), std::string::npos) << r.all();
  fs::remove_all(root);
}

}  // namespace
}  // namespace corelm::testing
