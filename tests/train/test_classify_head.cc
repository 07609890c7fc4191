// The classification head: config.json fields (HF id2label / label2id), the score.weight tensor
// through save/load, records and their errors, stratified splits, pooling, label smoothing,
// distillation from a teacher's soft targets,
// temperature scaling, and train() with the classify objective (learning, best-checkpoint
// selection, bit-identical resume), and weight averaging of heads (`corelm merge`).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/model_factories.h"
#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/model.h"
#include "corelm/model_dir.h"
#include "corelm/ops.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"
#include "corelm/train.h"

namespace corelm::train {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("corelm_classify_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

model::ModelConfig head_config(std::vector<std::string> labels, const std::string& pooling = "last") {
  model::ModelConfig c = corelm::testing::tiny_decoder_config(300, 0.05);
  c.labels = std::move(labels);
  c.classifier_pooling = pooling;
  return c;
}

std::vector<float> floats(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

std::unique_ptr<Tokenizer> make_tokenizer(const fs::path& dir) {
  std::string corpus;
  for (int i = 0; i < 40; ++i) corpus += "red apple cherry rose blue sky sea ocean green grass leaf tree\n";
  write_text(dir / "corpus.txt", corpus);
  BpeTrainOptions o;
  o.vocab_size = 300;
  train_bpe({(dir / "corpus.txt").string()}, o, (dir / "tokenizer.json").string());
  return Tokenizer::load((dir / "tokenizer.json").string());
}

// Two separable classes: texts made of "red" words or of "blue" words.
std::string toy_records(int n, uint64_t seed) {
  static const char* red[] = {"red", "apple", "cherry", "rose"};
  static const char* blue[] = {"blue", "sky", "sea", "ocean"};
  Generator g(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    const bool is_red = g.below(2) == 0;
    std::string text;
    const int words = 2 + static_cast<int>(g.below(5));
    for (int w = 0; w < words; ++w) text += std::string(w ? " " : "") + (is_red ? red : blue)[g.below(4)];
    out += nlohmann::json{{"text", text}, {"label", is_red ? "RED" : "BLUE"}}.dump() + "\n";
  }
  return out;
}

TEST(ClassifyHeadConfig, RoundTripsHfFields) {
  model::ModelConfig c = head_config({"neg", "pos", "neutral"}, "mean");
  c.classifier_temperature = 1.7;
  c.classifier_template = "Review: {text}";
  c.pad_token_id = 3;
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j["architectures"][0], "LlamaForSequenceClassification");
  EXPECT_EQ(j["id2label"]["2"], "neutral");
  EXPECT_EQ(j["label2id"]["pos"], 1);
  EXPECT_EQ(j["num_labels"], 3);
  const model::ModelConfig back = model::ModelConfig::from_json(j);
  EXPECT_EQ(back.labels, c.labels);
  EXPECT_EQ(back.classifier_pooling, "mean");
  EXPECT_DOUBLE_EQ(back.classifier_temperature, 1.7);
  EXPECT_EQ(back.classifier_template, "Review: {text}");
  EXPECT_EQ(back.pad_token_id, 3);
  EXPECT_EQ(back.num_parameters(), c.num_parameters());
}

TEST(ClassifyHeadConfig, CausalLmWithHfDefaultId2LabelHasNoHead) {
  nlohmann::json j = corelm::testing::tiny_decoder_config(300, 0.02).to_json();
  j["id2label"] = {{"0", "LABEL_0"}, {"1", "LABEL_1"}};  // what HF writes into every config
  EXPECT_FALSE(model::ModelConfig::from_json(j).has_classifier());
  EXPECT_EQ(model::ModelConfig::from_json(j).to_json()["architectures"][0], "LlamaForCausalLM");
}

TEST(ClassifyHeadConfig, InconsistentLabelFieldsAreFormatErrorsNamingTheField) {
  const nlohmann::json good = head_config({"a", "b"}).to_json();
  nlohmann::json j = good;
  j["label2id"]["a"] = 1;
  EXPECT_NE(error_of([&] { model::ModelConfig::from_json(j, "cfg.json"); }).find("cfg.json: field 'label2id'"),
            std::string::npos);
  j = good;
  j["num_labels"] = 5;
  EXPECT_NE(error_of([&] { model::ModelConfig::from_json(j, "cfg.json"); }).find("field 'num_labels'"),
            std::string::npos);
  j = good;
  j["id2label"] = {{"0", "a"}, {"7", "b"}};
  EXPECT_NE(error_of([&] { model::ModelConfig::from_json(j, "cfg.json"); }).find("'7' is not a label id"),
            std::string::npos);
  j = good;
  j["id2label"] = {{"0", "a"}, {"1", "a"}};
  j.erase("label2id");
  EXPECT_NE(error_of([&] { model::ModelConfig::from_json(j, "cfg.json"); }).find("appears twice"), std::string::npos);
  j = good;
  j.erase("id2label");
  EXPECT_THROW(model::ModelConfig::from_json(j), FormatError);
  j = good;
  j["classifier_pooling"] = "max";
  EXPECT_THROW(model::ModelConfig::from_json(j), ValueError);
}

TEST(ClassifyHeadModel, ScoreWeightIsAParameterAndSurvivesSaveLoad) {
  const fs::path dir = temp_dir("saveload");
  model::Decoder d(head_config({"x", "y", "z"}));
  d.init_weights(5);
  ASSERT_TRUE(d.has_parameter("score.weight"));
  EXPECT_EQ(d.classifier_weight().shape(), (Shape{3, 64}));
  EXPECT_EQ(d.named_parameters().back().first, "score.weight");
  model::save_model_dir(dir.string(), d);
  make_tokenizer(dir);  // load_model_dir wants one beside the weights
  const model::LoadedModel m = model::load_model_dir(dir.string());
  ASSERT_TRUE(m.decoder.config().has_classifier());
  EXPECT_EQ(m.decoder.config().labels, (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(floats(m.decoder.classifier_weight()), floats(d.classifier_weight()));
  // A model without a head says so when asked for one.
  model::Decoder plain(corelm::testing::tiny_decoder_config(300, 0.02));
  EXPECT_NE(error_of([&] { plain.classifier_weight(); }).find("no classification head"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ClassifyRecords, BadLabelEmptyFileAndMissingFieldNameFileAndLine) {
  const fs::path dir = temp_dir("records");
  auto tok = make_tokenizer(dir);
  ClassifyDataOptions o;
  o.labels = {"RED", "BLUE"};
  write_text(dir / "bad.jsonl", "{\"text\": \"red\", \"label\": \"RED\"}\n\n{\"text\": \"sky\", \"label\": \"GREEN\"}\n");
  const std::string bad = (dir / "bad.jsonl").string();
  EXPECT_NE(error_of([&] { load_classify_records(bad, *tok, o); })
                .find(bad + ":3: label 'GREEN' is not one of --labels (RED,BLUE)"),
            std::string::npos);
  write_text(dir / "empty.jsonl", "\n  \n");
  EXPECT_NE(error_of([&] { load_classify_records((dir / "empty.jsonl").string(), *tok, o); }).find("no records"),
            std::string::npos);
  write_text(dir / "nofield.jsonl", "{\"body\": \"red\", \"label\": \"RED\"}\n");
  EXPECT_NE(error_of([&] { load_classify_records((dir / "nofield.jsonl").string(), *tok, o); })
                .find("nofield.jsonl:1: missing string field \"text\""),
            std::string::npos);
  write_text(dir / "badjson.jsonl", "{\"text\": \"red\", \"label\": \"RED\"}\n{oops\n");
  EXPECT_NE(error_of([&] { load_classify_records((dir / "badjson.jsonl").string(), *tok, o); })
                .find("badjson.jsonl:2: invalid JSON"),
            std::string::npos);
  // Integer labels are read as their decimal spelling.
  write_text(dir / "int.jsonl", "{\"text\": \"red\", \"label\": 1}\n{\"text\": \"sky\", \"label\": 0}\n");
  o.labels = {"0", "1"};
  const auto recs = load_classify_records((dir / "int.jsonl").string(), *tok, o);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].label, 1);
  EXPECT_EQ(recs[1].label, 0);
  fs::remove_all(dir);
}

// --teacher-field: a teacher's distribution per record, as `run classify` writes "probs" ({label: p})
// or an array in label order; renormalised, and every malformed one named by FILE:LINE and field.
TEST(ClassifyRecords, TeacherDistributionsAreReadAndBadOnesNameFileLineAndField) {
  const fs::path dir = temp_dir("teacher");
  auto tok = make_tokenizer(dir);
  ClassifyDataOptions o;
  o.labels = {"RED", "BLUE", "GREEN"};
  o.teacher_field = "probs";
  write_text(dir / "ok.jsonl",
             "{\"text\": \"red\", \"label\": \"RED\", \"probs\": {\"BLUE\": 0.25, \"RED\": 0.7, \"GREEN\": 0.05}}\n"
             "{\"text\": \"sky\", \"label\": \"BLUE\", \"probs\": [0.1, 0.8, 0.1004]}\n");
  const auto recs = load_classify_records((dir / "ok.jsonl").string(), *tok, o);
  ASSERT_EQ(recs.size(), 2u);
  ASSERT_EQ(recs[0].teacher.size(), 3u);
  EXPECT_FLOAT_EQ(recs[0].teacher[0], 0.7f);
  EXPECT_FLOAT_EQ(recs[0].teacher[1], 0.25f);
  EXPECT_FLOAT_EQ(recs[0].teacher[2], 0.05f);
  EXPECT_NEAR(recs[1].teacher[0] + recs[1].teacher[1] + recs[1].teacher[2], 1.0, 1e-6);  // renormalised
  EXPECT_NEAR(recs[1].teacher[1], 0.8 / 1.0004, 1e-6);
  // Without the option the field is not read.
  ClassifyDataOptions plain = o;
  plain.teacher_field.clear();
  EXPECT_TRUE(load_classify_records((dir / "ok.jsonl").string(), *tok, plain)[0].teacher.empty());
  const std::string head = "{\"text\": \"red\", \"label\": \"RED\"";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", ":1: missing field \"probs\" (--teacher-field)"},
      {", \"probs\": {\"RED\": 0.5, \"PINK\": 0.5}", "names label 'PINK', not one of --labels (RED,BLUE,GREEN)"},
      {", \"probs\": {\"RED\": 0.5, \"BLUE\": 0.5}", "has no probability for label 'GREEN'"},
      {", \"probs\": [0.5, 0.5]", "holds 2 probabilities for 3 labels"},
      {", \"probs\": [0.5, \"x\", 0.5]", "entry 1 must be a number"},
      {", \"probs\": {\"RED\": 1.2, \"BLUE\": -0.2, \"GREEN\": 0}", "the probability of 'BLUE' must be finite and >= 0"},
      {", \"probs\": [0.5, 0.4, 0.05]", "the probabilities sum to 0.95, not 1"},
      {", \"probs\": \"RED\"", "must be an object {label: probability} or an array"},
  };
  for (const auto& [field, message] : bad) {
    write_text(dir / "bad.jsonl", head + field + "}\n");
    const std::string err = error_of([&] { load_classify_records((dir / "bad.jsonl").string(), *tok, o); });
    EXPECT_NE(err.find((dir / "bad.jsonl").string() + ":1: "), std::string::npos) << err;
    EXPECT_NE(err.find(message), std::string::npos) << field << " -> " << err;
  }
  fs::remove_all(dir);
}

TEST(ClassifyRecords, TemplateAndTruncation) {
  const fs::path dir = temp_dir("template");
  auto tok = make_tokenizer(dir);
  write_text(dir / "r.jsonl", "{\"text\": \"red apple cherry rose red apple\", \"label\": \"RED\"}\n");
  ClassifyDataOptions o;
  o.labels = {"RED", "BLUE"};
  o.template_text = "tree: {text} leaf";
  const auto full = load_classify_records((dir / "r.jsonl").string(), *tok, o);
  EXPECT_EQ(full[0].ids, tok->encode("tree: red apple cherry rose red apple leaf"));
  o.max_tokens = 3;
  EXPECT_EQ(load_classify_records((dir / "r.jsonl").string(), *tok, o)[0].ids.size(), 3u);
  o.template_text = "no placeholder";
  EXPECT_THROW(load_classify_records((dir / "r.jsonl").string(), *tok, o), ValueError);
  fs::remove_all(dir);
}

TEST(ClassifySplit, StratifiedKeepsEveryClassInBothParts) {
  std::vector<ClassifyRecord> all;
  for (int i = 0; i < 100; ++i) all.push_back({{1, 2}, i < 90 ? 0 : 1, {}});  // 90 / 10
  std::vector<ClassifyRecord> train, dev;
  stratified_split(all, 0.2, train, dev, 2);
  EXPECT_EQ(label_counts(dev, 2), (std::vector<int64_t>{18, 2}));
  EXPECT_EQ(label_counts(train, 2), (std::vector<int64_t>{72, 8}));
  EXPECT_THROW(stratified_split(all, 1.0, train, dev, 2), ValueError);
}

TEST(ClassifyHead, PoolingPicksTheLastRealTokenOrTheMeanAndIgnoresPadding) {
  for (const std::string pooling : {"last", "mean"}) {
    model::Decoder d(head_config({"a", "b", "c"}, pooling));
    d.init_weights(9);
    const ClassifyRecord r1{{5, 6, 7, 8, 9}, 0, {}}, r2{{11, 12}, 1, {}};
    const Tensor both = classifier_logits(d, make_classify_batch({&r1, &r2}, 0), false);
    const Tensor alone = classifier_logits(d, make_classify_batch({&r2}, 0), false);
    // Row 2 padded to 5 gives its unpadded logits (causal mask: padding comes after).
    const auto b = floats(both), a = floats(alone);
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(b[3 + j], a[j], 1e-5) << pooling;
    // Against the hidden states by hand.
    autograd::NoGradGuard ng;
    const Tensor h = d.forward_hidden(Tensor::from_vector(std::vector<int64_t>{5, 6, 7, 8, 9}, {1, 5})).contiguous();
    const Tensor w = d.classifier_weight().contiguous();
    const int64_t H = 64;
    for (int j = 0; j < 3; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < H; ++k) {
        double pooled = 0;
        if (pooling == "last") pooled = h.data<float>()[4 * H + k];
        else
          for (int t = 0; t < 5; ++t) pooled += h.data<float>()[t * H + k] / 5.0;
        acc += pooled * w.data<float>()[j * H + k];
      }
      EXPECT_NEAR(b[j], acc, 1e-4) << pooling;
    }
  }
}

TEST(ClassifyHead, LabelSmoothingLossIsTorchsFormula) {
  model::Decoder d(head_config({"a", "b", "c", "d"}));
  d.init_weights(3);
  const ClassifyRecord r1{{5, 6, 7}, 2, {}}, r2{{8, 9}, 0, {}};
  const Batch b = make_classify_batch({&r1, &r2}, 0);
  ClassifyTrainOptions o;
  o.label_smoothing = 0.1;
  std::vector<ClassifyRecord> dev;
  ClassifyObjective obj(dev, o);
  autograd::NoGradGuard ng;
  const double loss = obj.loss(d, b).item();
  const auto z = floats(classifier_logits(d, b));
  double expect = 0;
  const int64_t labels[2] = {2, 0};
  for (int r = 0; r < 2; ++r) {
    double m = -1e30, s = 0;
    for (int j = 0; j < 4; ++j) m = std::max(m, double(z[r * 4 + j]));
    for (int j = 0; j < 4; ++j) s += std::exp(z[r * 4 + j] - m);
    const double lse = m + std::log(s);
    double row = 0;
    for (int j = 0; j < 4; ++j) row += (0.1 / 4 + (j == labels[r] ? 0.9 : 0.0)) * (lse - z[r * 4 + j]);
    expect += row / 2;
  }
  EXPECT_NEAR(loss, expect, 1e-5);
  ClassifyTrainOptions bad;
  bad.label_smoothing = 1.0;
  EXPECT_THROW(ClassifyObjective(dev, bad), ValueError);
}

// Distillation: (1 - w) * (the smoothed CE on the labels) + w * (-sum_c q_c log p_c), averaged over
// the rows; w = 0 or a batch without soft targets is the plain loss, a teacher that is the one-hot
// label at w = 1 is the plain CE, rows with and without a teacher are refused in one batch, and a
// weight outside [0, 1] is refused naming the option.
TEST(ClassifyHead, DistillationLossMixesTheLabelsAndTheTeachersCrossEntropy) {
  model::Decoder d(head_config({"a", "b", "c", "d"}));
  d.init_weights(3);
  const ClassifyRecord r1{{5, 6, 7}, 2, {0.1f, 0.2f, 0.6f, 0.1f}}, r2{{8, 9}, 0, {0.4f, 0.3f, 0.2f, 0.1f}};
  const Batch b = make_classify_batch({&r1, &r2}, 0);
  ASSERT_TRUE(b.soft_targets.defined());
  EXPECT_EQ(b.soft_targets.shape(), (Shape{2, 4}));
  autograd::NoGradGuard ng;
  const auto z = floats(classifier_logits(d, b));
  const int64_t labels[2] = {2, 0};
  const std::vector<float>* teacher[2] = {&r1.teacher, &r2.teacher};
  auto expect = [&](double eps, double w) {
    double total = 0;
    for (int r = 0; r < 2; ++r) {
      double m = -1e30, s = 0;
      for (int j = 0; j < 4; ++j) m = std::max(m, double(z[r * 4 + j]));
      for (int j = 0; j < 4; ++j) s += std::exp(z[r * 4 + j] - m);
      const double lse = m + std::log(s);
      double hard = 0, soft = 0;
      for (int j = 0; j < 4; ++j) {
        hard += (eps / 4 + (j == labels[r] ? 1 - eps : 0.0)) * (lse - z[r * 4 + j]);
        soft += (*teacher[r])[j] * (lse - z[r * 4 + j]);
      }
      total += ((1 - w) * hard + w * soft) / 2;
    }
    return total;
  };
  std::vector<ClassifyRecord> dev;
  for (double eps : {0.0, 0.1})
    for (double w : {0.0, 0.3, 0.5, 1.0}) {
      ClassifyTrainOptions o;
      o.label_smoothing = eps;
      o.distill_weight = w;
      ClassifyObjective obj(dev, o);
      EXPECT_NEAR(obj.loss(d, b).item(), expect(eps, w), 1e-5) << "eps " << eps << " w " << w;
    }
  // Without soft targets in the batch the weight does nothing.
  const ClassifyRecord p1{{5, 6, 7}, 2, {}}, p2{{8, 9}, 0, {}};
  const Batch plain = make_classify_batch({&p1, &p2}, 0);
  EXPECT_FALSE(plain.soft_targets.defined());
  ClassifyTrainOptions o;
  o.distill_weight = 1.0;
  ClassifyObjective obj(dev, o);
  const double ce = ops::cross_entropy(classifier_logits(d, plain), plain.targets).item();
  EXPECT_NEAR(obj.loss(d, plain).item(), ce, 1e-6);
  // A one-hot teacher on the label at w = 1 is the plain CE.
  const ClassifyRecord h1{{5, 6, 7}, 2, {0, 0, 1, 0}}, h2{{8, 9}, 0, {1, 0, 0, 0}};
  EXPECT_NEAR(obj.loss(d, make_classify_batch({&h1, &h2}, 0)).item(), ce, 1e-5);
  EXPECT_THROW(make_classify_batch({&r1, &p2}, 0), ValueError);
  ClassifyTrainOptions bad;
  bad.distill_weight = 1.5;
  EXPECT_NE(error_of([&] { ClassifyObjective(dev, bad); }).find("--distill-weight must be in [0, 1]"), std::string::npos);
}

// --classifier-dropout: inverted dropout on the pooled state, training only. The masks are a function
// of (seed, batch) (so a resumed run draws a straight run's masks), dropout 0 is the plain loss, the
// mean over masks is the undropped logits, and a rate outside [0, 1) is refused naming the option.
TEST(ClassifyHead, ClassifierDropoutIsUnbiasedSeededByTheBatchAndOnlyInTraining) {
  model::Decoder d(head_config({"a", "b", "c"}, "mean"));
  d.init_weights(4);
  const ClassifyRecord r1{{5, 6, 7}, 2, {}}, r2{{8, 9}, 0, {}};
  const Batch b = make_classify_batch({&r1, &r2}, 0);
  std::vector<ClassifyRecord> dev;
  autograd::NoGradGuard ng;
  auto loss_with = [&](double p, uint64_t seed, const Batch& batch) {
    ClassifyTrainOptions o;
    o.dropout = p;
    o.seed = seed;
    ClassifyObjective obj(dev, o);
    return obj.loss(d, batch).item();
  };
  const double plain = ops::cross_entropy(classifier_logits(d, b), b.targets).item();
  EXPECT_EQ(loss_with(0, 1, b), plain);
  const double dropped = loss_with(0.5, 1, b);
  EXPECT_NE(dropped, plain);
  EXPECT_EQ(loss_with(0.5, 1, b), dropped);  // the same (seed, batch): the same masks
  EXPECT_NE(loss_with(0.5, 2, b), dropped);  // another seed: other masks
  const ClassifyRecord r3{{5, 6, 7}, 2, {}}, r4{{8, 10}, 0, {}};
  EXPECT_NE(loss_with(0.5, 1, make_classify_batch({&r3, &r4}, 0)), dropped);  // another batch: other masks
  // Inverted dropout is unbiased: the mean of the dropped logits over many masks is the plain logits.
  const auto z = floats(classifier_logits(d, b));
  std::vector<double> mean(z.size(), 0.0);
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    Generator g(1000 + i);
    const auto zi = floats(classifier_logits(d, b, true, 0.3f, &g));
    for (size_t j = 0; j < z.size(); ++j) mean[j] += zi[j] / n;
  }
  double scale = 0;
  for (float v : z) scale = std::max(scale, std::abs(double(v)));
  for (size_t j = 0; j < z.size(); ++j) EXPECT_NEAR(mean[j], z[j], 0.05 * scale + 1e-4) << j;
  // Evaluation never drops: the dev scores of a model are the same whatever the rate.
  const std::vector<ClassifyRecord> dev2{r1, r2};
  auto dev_loss = [&](double p) {
    ClassifyTrainOptions o;
    o.dropout = p;
    o.seed = 1;
    ClassifyObjective obj(dev2, o);
    std::vector<std::pair<std::string, double>> fields;
    return obj.evaluate(d, 1, fields);
  };
  EXPECT_EQ(dev_loss(0.5), dev_loss(0));
  for (const double bad : {1.0, -0.1, std::nan("")}) {
    ClassifyTrainOptions o;
    o.dropout = bad;
    EXPECT_NE(error_of([&] { ClassifyObjective(dev, o); }).find("--classifier-dropout must be in [0, 1)"), std::string::npos)
        << bad;
  }
}

TEST(ClassifyCalibration, TemperatureUndoesAScaling) {
  // Logits whose true temperature is 1 (labels drawn from softmax(z)), shown scaled by 3: the fit
  // must find T ~ 3, and the ECE after it is lower than before.
  Generator g(1);
  std::vector<std::vector<float>> logits;
  std::vector<int64_t> labels;
  for (int i = 0; i < 4000; ++i) {
    std::vector<float> z = {static_cast<float>(g.normal()), static_cast<float>(g.normal()), static_cast<float>(g.normal())};
    double s = 0;
    for (float v : z) s += std::exp(v);
    double u = (g.below(1000000) + 0.5) / 1e6, c = 0;
    int64_t y = 2;
    for (int j = 0; j < 3; ++j) {
      c += std::exp(z[j]) / s;
      if (u < c) {
        y = j;
        break;
      }
    }
    for (float& v : z) v *= 3;
    logits.push_back(z);
    labels.push_back(y);
  }
  const double t = fit_temperature(logits, labels);
  EXPECT_NEAR(t, 3.0, 0.3);
  EXPECT_LT(calibration_stats(logits, labels, t).ece, calibration_stats(logits, labels, 1.0).ece);
  EXPECT_LT(calibration_stats(logits, labels, t).ece, 0.03);
}

struct ToyRun {
  fs::path dir;
  std::unique_ptr<Tokenizer> tok;
  std::vector<ClassifyRecord> train, dev;
};

ToyRun toy_run(const std::string& name) {
  ToyRun t;
  t.dir = temp_dir(name);
  t.tok = make_tokenizer(t.dir);
  write_text(t.dir / "train.jsonl", toy_records(160, 1));
  write_text(t.dir / "dev.jsonl", toy_records(40, 2));
  ClassifyDataOptions o;
  o.labels = {"RED", "BLUE"};
  t.train = load_classify_records((t.dir / "train.jsonl").string(), *t.tok, o);
  t.dev = load_classify_records((t.dir / "dev.jsonl").string(), *t.tok, o);
  return t;
}

TrainOptions toy_options(const fs::path& out, int64_t steps) {
  TrainOptions o;
  o.out_dir = out.string();
  o.steps = steps;
  o.batch = 16;
  o.seq = 16;
  o.schedule.lr = 3e-3;
  o.schedule.warmup = 2;
  o.eval_every = 5;
  o.progress = false;
  o.sample_tokens = 0;
  o.keep_checkpoints = 10;
  return o;
}

TEST(ClassifyTrain, LearnsSeparableClassesKeepsBestAndWritesTemperature) {
  ToyRun t = toy_run("learn");
  model::Decoder d(head_config({"RED", "BLUE"}));
  d.init_weights(1);
  ClassifyTrainOptions co;
  co.label_smoothing = 0.1;
  ClassifyObjective obj(t.dev, co);
  ClassifySampler sampler(t.train, 2, false, 0, 7);
  TrainOptions o = toy_options(t.dir / "out", 30);
  o.objective = &obj;
  const TrainResult r = train(d, sampler, nullptr, nullptr, (t.dir / "tokenizer.json").string(), o);
  ASSERT_TRUE(r.last_val_loss.has_value());
  ASSERT_TRUE(obj.has_best());
  EXPECT_GE(obj.best_accuracy(), 0.95);
  const ClassifyFinish f = finish_classifier(d, obj, t.dev, o.out_dir, 0);
  EXPECT_EQ(f.best_step, obj.best_step());
  EXPECT_DOUBLE_EQ(f.dev_accuracy, obj.best_accuracy());
  EXPECT_GT(f.temperature, 0);
  // OUT holds the best evaluation's weights and the fitted temperature.
  const model::LoadedModel m = model::load_model_dir(o.out_dir);
  EXPECT_DOUBLE_EQ(m.decoder.config().classifier_temperature, f.temperature);
  std::vector<int64_t> labels;
  for (const auto& rec : t.dev) labels.push_back(rec.label);
  EXPECT_DOUBLE_EQ(calibration_stats(classify_logits(m.decoder, t.dev, 0), labels, 1.0).accuracy, obj.best_accuracy());
  // The dev log lines carry the accuracy.
  std::ifstream log(t.dir / "out" / "train_log.jsonl");
  std::string line;
  int with_acc = 0;
  while (std::getline(log, line)) with_acc += nlohmann::json::parse(line).contains("dev_accuracy");
  EXPECT_EQ(with_acc, 6);
  fs::remove_all(t.dir);
}

// The teacher drives training: at w = 1 a teacher that names the other class for every record
// trains a head that is wrong on the dev labels, and at w = 0 the same records train a right one.
TEST(ClassifyTrain, ATeachersSoftTargetsAreWhatTheHeadLearnsAtFullWeight) {
  for (const double w : {1.0, 0.0}) {
    ToyRun t = toy_run(w == 1 ? "distil_full" : "distil_none");
    for (auto& r : t.train) r.teacher = r.label == 0 ? std::vector<float>{0.05f, 0.95f} : std::vector<float>{0.95f, 0.05f};
    model::Decoder d(head_config({"RED", "BLUE"}));
    d.init_weights(1);
    ClassifyTrainOptions co;
    co.distill_weight = w;
    ClassifyObjective obj(t.dev, co);
    ClassifySampler sampler(t.train, 2, false, 0, 7);
    TrainOptions o = toy_options(t.dir / "out", 30);
    o.objective = &obj;
    train(d, sampler, nullptr, nullptr, "", o);
    std::vector<int64_t> labels;
    for (const auto& rec : t.dev) labels.push_back(rec.label);
    const double acc = calibration_stats(classify_logits(d, t.dev, 0), labels, 1.0).accuracy;
    if (w == 1) EXPECT_LE(acc, 0.05);
    else EXPECT_GE(acc, 0.95);
    fs::remove_all(t.dir);
  }
}

TEST(ClassifyTrain, FrozenBodyTrainsOnlyTheHead) {
  ToyRun t = toy_run("frozen");
  model::Decoder d(head_config({"RED", "BLUE"}));
  d.init_weights(1);
  const auto embed_before = floats(d.parameter("model.embed_tokens.weight"));
  const auto head_before = floats(d.classifier_weight());
  ClassifyTrainOptions co;
  co.train_body = false;
  ClassifyObjective obj(t.dev, co);
  ClassifySampler sampler(t.train, 2, true, 0, 7);
  TrainOptions o = toy_options(t.dir / "out", 6);
  o.objective = &obj;
  train(d, sampler, nullptr, nullptr, "", o);
  EXPECT_EQ(floats(d.parameter("model.embed_tokens.weight")), embed_before);
  EXPECT_NE(floats(d.classifier_weight()), head_before);
  fs::remove_all(t.dir);
}

TEST(ClassifyTrain, ResumeIsBitIdentical) {
  ToyRun t = toy_run("resume");
  auto run = [&](const fs::path& out, int64_t stop_at, bool resume, model::Decoder& d, double dropout) {
    ClassifyTrainOptions co;
    co.label_smoothing = 0.1;
    co.dropout = dropout;
    co.seed = 7;
    ClassifyObjective obj(t.dev, co);
    ClassifySampler sampler(t.train, 2, false, 0, 7);
    TrainOptions o = toy_options(out, 12);
    o.objective = &obj;
    o.stop_at = stop_at;
    o.resume = resume;
    train(d, sampler, nullptr, nullptr, "", o);
  };
  std::vector<float> head_without_dropout;
  for (const double dropout : {0.0, 0.3}) {  // with --classifier-dropout the resumed run draws the same masks
    const std::string tag = dropout > 0 ? "_dropout" : "";
    model::Decoder straight(head_config({"RED", "BLUE"}));
    straight.init_weights(1);
    run(t.dir / ("a" + tag), 0, false, straight, dropout);
    model::Decoder resumed(head_config({"RED", "BLUE"}));
    resumed.init_weights(1);
    run(t.dir / ("b" + tag), 7, false, resumed, dropout);  // the straight run crosses an epoch boundary (160 records) at step 10
    model::Decoder again(head_config({"RED", "BLUE"}));
    again.init_weights(1);
    run(t.dir / ("b" + tag), 0, true, again, dropout);
    for (size_t i = 0; i < straight.named_parameters().size(); ++i)
      EXPECT_EQ(floats(straight.named_parameters()[i].second), floats(again.named_parameters()[i].second))
          << straight.named_parameters()[i].first << " dropout " << dropout;
    if (dropout == 0) head_without_dropout = floats(straight.classifier_weight());
    else EXPECT_NE(floats(straight.classifier_weight()), head_without_dropout);  // the rate reached training
  }
  fs::remove_all(t.dir);
}

// A run stopped between evaluations resumes with the best dev choice it had made (persisted in
// out_dir/best_dev.safetensors) and ends with the same best step and weights as a straight run.
TEST(ClassifyTrain, ResumeKeepsTheBestSoFar) {
  ToyRun t = toy_run("resume_best");
  struct Run {
    int64_t best_step;
    double best_acc;
    std::vector<std::vector<float>> best;
  };
  auto run = [&](const fs::path& out, int64_t stop_at, bool resume) {
    model::Decoder d(head_config({"RED", "BLUE"}));
    d.init_weights(1);
    ClassifyObjective obj(t.dev, ClassifyTrainOptions{});
    ClassifySampler sampler(t.train, 2, false, 0, 7);
    TrainOptions o = toy_options(out, 12);
    o.objective = &obj;
    o.stop_at = stop_at;
    o.resume = resume;
    train(d, sampler, nullptr, nullptr, "", o);
    obj.restore_best(d);
    Run r{obj.best_step(), obj.best_accuracy(), {}};
    for (const auto& [name, p] : d.named_parameters()) r.best.push_back(floats(p));
    return r;
  };
  const Run straight = run(t.dir / "a", 0, false);
  const Run first = run(t.dir / "b", 7, false);  // step 5 competes; the evaluation at the stop (7) does not
  EXPECT_EQ(first.best_step, 5);
  const fs::path file = t.dir / "b" / "best_dev.safetensors";
  ASSERT_TRUE(fs::exists(file));
  {
    ClassifyObjective probe(t.dev, ClassifyTrainOptions{});
    probe.on_start((t.dir / "b").string(), 7, 5, 12);
    EXPECT_TRUE(probe.has_best());
    EXPECT_EQ(probe.best_step(), 5);
    EXPECT_EQ(probe.best_accuracy(), first.best_acc);
    ClassifyObjective early(t.dev, ClassifyTrainOptions{});
    early.on_start((t.dir / "b").string(), 4, 5, 12);  // resuming before step 5: that best is not kept
    EXPECT_FALSE(early.has_best());
    EXPECT_TRUE(fs::exists(file));
  }
  const Run resumed = run(t.dir / "b", 0, true);
  EXPECT_EQ(resumed.best_step, straight.best_step);
  EXPECT_EQ(resumed.best_acc, straight.best_acc);
  EXPECT_EQ(resumed.best, straight.best);
  {
    ClassifyObjective fresh(t.dev, ClassifyTrainOptions{});
    fresh.on_start((t.dir / "b").string(), -1, 5, 12);  // a run without --resume drops an older best
    EXPECT_FALSE(fresh.has_best());
    EXPECT_FALSE(fs::exists(file));
  }
  fs::remove_all(t.dir);
}

TEST(ClassifySampler, EpochsVisitEveryRecordOnceAndBalancedDrawsEvenClasses) {
  std::vector<ClassifyRecord> recs;
  for (int i = 0; i < 30; ++i) recs.push_back({{static_cast<TokenId>(i + 1)}, i < 27 ? 0 : 1, {}});
  ClassifySampler epochs(recs, 2, false, 0, 3);
  std::vector<int> seen(30, 0);
  for (int b = 0; b < 3; ++b)
    for (int64_t id : epochs.next(10, 0).ids.to_int_vector()) ++seen[static_cast<size_t>(id - 1)];
  for (int s : seen) EXPECT_EQ(s, 1);
  ClassifySampler balanced(recs, 2, true, 0, 3);
  int minority = 0;
  for (int b = 0; b < 40; ++b)
    for (int64_t y : balanced.next(10, 0).targets.to_int_vector()) minority += y == 1;
  EXPECT_NEAR(minority / 400.0, 0.5, 0.08);
}

// ---- weight averaging (`corelm merge`, src/train/soup.cc): the mean is element-wise, configs and
// tokenizers must match, the greedy soup never scores below its best ingredient on dev and leaves
// out a model that hurts, and model directories round-trip with a fitted temperature.

TEST(Soup, AverageIsTheElementwiseMeanAtTemperatureOne) {
  model::ModelConfig c = head_config({"A", "B", "C"}, "mean");
  c.classifier_temperature = 2.5;
  model::Decoder a(c), b(c);
  a.init_weights(1);
  b.init_weights(2);
  const model::Decoder m = average_decoders({&a, &b}, {"a", "b"});
  EXPECT_DOUBLE_EQ(m.config().classifier_temperature, 1.0);
  ASSERT_EQ(m.named_parameters().size(), a.named_parameters().size());
  for (size_t p = 0; p < a.named_parameters().size(); ++p) {
    const auto x = floats(a.named_parameters()[p].second), y = floats(b.named_parameters()[p].second);
    const auto z = floats(m.named_parameters()[p].second);
    ASSERT_EQ(z.size(), x.size()) << a.named_parameters()[p].first;
    for (size_t k = 0; k < z.size(); ++k) ASSERT_FLOAT_EQ(z[k], (x[k] + y[k]) / 2) << a.named_parameters()[p].first;
  }
}

TEST(Soup, MethodNamesRoundTrip) {
  for (const std::string& name : soup_method_names()) EXPECT_EQ(soup_method_name(parse_soup_method(name)), name);
  EXPECT_EQ(soup_method_name(SoupMethod::kGreedy), "greedy");
  EXPECT_NE(error_of([] { parse_soup_method("mean"); }).find("--method"), std::string::npos);
}

TEST(Soup, RefusesOtherConfigsNamingTheModelAndTheField) {
  model::Decoder a(head_config({"A", "B"}));
  model::ModelConfig other = head_config({"A", "B"});
  other.intermediate_size *= 2;
  model::Decoder b(other), c(head_config({"A", "X"}));
  std::string e = error_of([&] { average_decoders({&a, &b}, {"dirA", "dirB"}); });
  EXPECT_NE(e.find("dirB"), std::string::npos) << e;
  EXPECT_NE(e.find("intermediate_size"), std::string::npos) << e;
  e = error_of([&] { average_decoders({&a, &c}, {"dirA", "dirC"}); });
  EXPECT_NE(e.find("dirC"), std::string::npos) << e;
  e = error_of([&] { average_decoders({&a}, {"dirA"}); });
  EXPECT_NE(e.find("at least two"), std::string::npos) << e;
}

// A head trained on the toy classes (toy_run's data), its best dev evaluation restored.
struct Trained {
  ToyRun run;
  std::unique_ptr<model::Decoder> model;
};

Trained trained(const std::string& name) {
  Trained t{toy_run(name), std::make_unique<model::Decoder>(head_config({"RED", "BLUE"}, "mean"))};
  t.model->init_weights(1);
  ClassifyObjective obj(t.run.dev, ClassifyTrainOptions{});
  ClassifySampler sampler(t.run.train, 2, false, 0, 7);
  TrainOptions o = toy_options(t.run.dir / "run", 30);
  o.eval_every = 10;
  o.objective = &obj;
  train(*t.model, sampler, nullptr, nullptr, (t.run.dir / "tokenizer.json").string(), o);
  obj.restore_best(*t.model);
  return t;
}

// A copy of `m` with its head replaced by `factor` x the head (everything else shared by value).
model::Decoder with_head_scaled(const model::Decoder& m, float factor, float noise_seed = 0) {
  model::Decoder out(m.config());
  for (const auto& [name, t] : m.named_parameters()) out.load_parameter(name, t);
  autograd::NoGradGuard no_grad;
  Tensor w = m.classifier_weight().clone();
  if (noise_seed != 0) {
    Generator g(static_cast<uint64_t>(noise_seed));
    w = ops::add(w, Tensor::randn(w.shape(), g, 0.01f));
  }
  out.load_parameter("score.weight", ops::scale(w, factor));
  return out;
}

TEST(Soup, GreedyLeavesOutAModelThatHurtsAndNeverFallsBelowItsBest) {
  Trained t = trained("greedy");
  std::vector<int64_t> labels;
  for (const auto& r : t.run.dev) labels.push_back(r.label);
  const double best_alone = calibration_stats(classify_logits(*t.model, t.run.dev, 0), labels, 1.0).accuracy;
  ASSERT_GE(best_alone, 0.9);
  // A near-copy (a little noise on the head) and a poison: the head flipped and tripled, so any
  // average that takes it in has a flipped head.
  const model::Decoder twin = with_head_scaled(*t.model, 1.0f, 5);
  const model::Decoder poison = with_head_scaled(*t.model, -3.0f);
  const std::vector<const model::Decoder*> models{&poison, t.model.get(), &twin};
  const std::vector<std::string> names{"poison", "good", "twin"};

  const Soup greedy = classifier_soup(models, names, t.run.dev, 0, SoupMethod::kGreedy);
  ASSERT_EQ(greedy.result.ingredients.size(), 3u);
  EXPECT_EQ(greedy.result.ingredients.back().name, "poison");  // the worst alone is tried last
  EXPECT_FALSE(greedy.result.ingredients.back().kept);
  EXPECT_TRUE(greedy.result.ingredients[0].kept);
  EXPECT_TRUE(greedy.result.ingredients[1].kept);
  EXPECT_GE(greedy.result.dev_accuracy, best_alone);
  EXPECT_LT(greedy.result.ingredients.back().dev_accuracy, 0.5);
  // The decoder is the soup the result describes, with the fitted temperature in its config.
  EXPECT_GT(greedy.result.temperature, 0);
  EXPECT_DOUBLE_EQ(greedy.decoder.config().classifier_temperature, greedy.result.temperature);
  EXPECT_DOUBLE_EQ(calibration_stats(classify_logits(greedy.decoder, t.run.dev, 0), labels, 1.0).accuracy,
                   greedy.result.dev_accuracy);
  // The uniform soup takes the poison in and its head flips.
  const Soup uniform = classifier_soup(models, names, t.run.dev, 0, SoupMethod::kUniform);
  for (const auto& g : uniform.result.ingredients) EXPECT_TRUE(g.kept);
  EXPECT_LT(uniform.result.dev_accuracy, 0.5);
  fs::remove_all(t.run.dir);
}

TEST(Merge, ModelDirectoriesRoundTripAndBadInputsAreNamed) {
  Trained t = trained("dirs");
  const model::Decoder twin = with_head_scaled(*t.model, 1.0f, 9);
  for (const auto& [name, m] : std::vector<std::pair<std::string, const model::Decoder*>>{{"a", t.model.get()},
                                                                                          {"b", &twin}}) {
    model::save_model_dir((t.run.dir / name).string(), *m);
    fs::copy_file(t.run.dir / "tokenizer.json", t.run.dir / name / "tokenizer.json");
  }
  MergeOptions o;
  o.models = {(t.run.dir / "a").string(), (t.run.dir / "b").string()};
  o.out = (t.run.dir / "soup").string();
  o.dev = (t.run.dir / "dev.jsonl").string();
  const MergeReport r = merge_model_dirs(o);
  EXPECT_TRUE(r.scored);
  EXPECT_EQ(r.method, SoupMethod::kGreedy);
  const model::LoadedModel m = model::load_model_dir(o.out);
  EXPECT_DOUBLE_EQ(m.decoder.config().classifier_temperature, r.soup.temperature);
  std::vector<int64_t> labels;
  for (const auto& rec : t.run.dev) labels.push_back(rec.label);
  EXPECT_DOUBLE_EQ(calibration_stats(classify_logits(m.decoder, t.run.dev, 0), labels, 1.0).accuracy,
                   r.soup.dev_accuracy);
  EXPECT_EQ(m.tokenizer->vocab_size(), t.run.tok->vocab_size());

  // A third directory with a's weights (a checkpoint that is a run's own final weights): left out,
  // reported as a's duplicate, and the soup is the one of a and b; a with its copy alone is refused.
  model::save_model_dir((t.run.dir / "c").string(), *t.model);
  fs::copy_file(t.run.dir / "tokenizer.json", t.run.dir / "c" / "tokenizer.json");
  MergeOptions d = o;
  d.models.push_back((t.run.dir / "c").string());
  d.out = (t.run.dir / "soup3").string();
  const MergeReport r3 = merge_model_dirs(d);
  ASSERT_EQ(r3.soup.ingredients.size(), 3u);
  EXPECT_EQ(r3.soup.ingredients.back().name, d.models[2]);
  EXPECT_EQ(r3.soup.ingredients.back().duplicate_of, d.models[0]);
  EXPECT_FALSE(r3.soup.ingredients.back().kept);
  EXPECT_DOUBLE_EQ(r3.soup.ingredients.back().dev_accuracy, r3.soup.ingredients[0].name == d.models[0]
                                                                ? r3.soup.ingredients[0].dev_accuracy
                                                                : r3.soup.ingredients[1].dev_accuracy);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(r3.soup.ingredients[i].duplicate_of.empty());
  EXPECT_DOUBLE_EQ(r3.soup.dev_accuracy, r.soup.dev_accuracy);
  EXPECT_DOUBLE_EQ(r3.soup.temperature, r.soup.temperature);
  d.models = {(t.run.dir / "a").string(), (t.run.dir / "c").string()};
  std::string same = error_of([&] { merge_model_dirs(d); });
  EXPECT_NE(same.find(d.models[1] + " has the same weights as " + d.models[0]), std::string::npos) << same;
  EXPECT_NE(same.find("fewer than two distinct"), std::string::npos) << same;
  // A slightly different copy is not a duplicate.
  const model::Decoder near = with_head_scaled(*t.model, 1.0f + 1e-6f);
  model::save_model_dir((t.run.dir / "c").string(), near);
  d.models = {(t.run.dir / "a").string(), (t.run.dir / "c").string()};
  for (const auto& g : merge_model_dirs(d).soup.ingredients) EXPECT_TRUE(g.duplicate_of.empty()) << g.name;

  // Without --dev: the plain mean, every model kept; greedy needs a dev set.
  o.dev.clear();
  o.out = (t.run.dir / "mean").string();
  EXPECT_EQ(merge_model_dirs(o).method, SoupMethod::kUniform);
  o.method = SoupMethod::kGreedy;
  EXPECT_NE(error_of([&] { merge_model_dirs(o); }).find("--dev"), std::string::npos);
  o.method.reset();

  // Another tokenizer: refused, naming the directory.
  std::string other = "x";
  {
    std::ifstream in(t.run.dir / "tokenizer.json");
    other = std::string(std::istreambuf_iterator<char>(in), {});
  }
  write_text(t.run.dir / "b" / "tokenizer.json", other + " ");
  std::string e = error_of([&] { merge_model_dirs(o); });
  EXPECT_NE(e.find((t.run.dir / "b").string() + "/tokenizer.json differs"), std::string::npos) << e;
  // A dev label outside the head's labels: the record's file and line.
  fs::copy_file(t.run.dir / "tokenizer.json", t.run.dir / "b" / "tokenizer.json", fs::copy_options::overwrite_existing);
  write_text(t.run.dir / "bad.jsonl", "{\"text\": \"red rose\", \"label\": \"RED\"}\n{\"text\": \"sky\", \"label\": \"GREEN\"}\n");
  o.dev = (t.run.dir / "bad.jsonl").string();
  e = error_of([&] { merge_model_dirs(o); });
  EXPECT_NE(e.find("bad.jsonl:2"), std::string::npos) << e;
  EXPECT_NE(e.find("GREEN"), std::string::npos) << e;
  fs::remove_all(t.run.dir);
}

}  // namespace
}  // namespace corelm::train
