// corelm eval-task (issue 14, first slice): the classification metrics against an independent
// numpy computation (tests/pipeline/classify_metrics_oracle.py), and the end-to-end evaluation
// through the corpus runner with its negative cases (unknown gold label, missing label field,
// no labelled record, duplicate labels).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "corelm/error.h"
#include "corelm/eval_task.h"
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
