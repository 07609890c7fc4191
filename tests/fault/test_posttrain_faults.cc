// Bad input to post-training with the classification head, through the real binary: records
// whose label is not in --labels (FILE:LINE), empty and single-class data, label sets that differ
// between a model's head and --labels (run classify, eval-task), a head model given to the
// language-model path. Plus the positive controls the errors are measured against: a head model
// trained by the CLI is run by `run classify` with exactly the head's probabilities, with its
// stored labels and template by default, and with a reordered subset of its labels.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cli_runner.h"
#include "corelm/model_dir.h"
#include "corelm/tokenizer.h"
#include "corelm/train.h"

namespace corelm::testing {
namespace {
namespace fs = std::filesystem;

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string records(int n, uint32_t seed, bool one_class = false) {
  static const char* red[] = {"red", "apple", "cherry", "rose"};
  static const char* blue[] = {"blue", "sky", "sea", "ocean"};
  std::string out;
  uint32_t s = seed;
  auto next = [&] { return (s = s * 1664525u + 1013904223u) >> 8; };
  for (int i = 0; i < n; ++i) {
    const bool is_red = one_class || next() % 2 == 0;
    std::string text;
    for (int w = 0, k = 2 + static_cast<int>(next() % 4); w < k; ++w)
      text += std::string(w ? " " : "") + (is_red ? red : blue)[next() % 4];
    out += nlohmann::json{{"text", text}, {"label", is_red ? "RED" : "BLUE"}}.dump() + "\n";
  }
  return out;
}

class PosttrainFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("corelm_posttrain_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    write_text(root_ / "train.jsonl", records(120, 1));
    write_text(root_ / "dev.jsonl", records(30, 2));
    write_text(root_ / "config.json",
               R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
                   "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                   "max_position_embeddings": 64, "tie_word_embeddings": true})");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::string path(const std::string& n) const { return (root_ / n).string(); }
  std::vector<std::string> train_args(const std::string& data, const std::string& out,
                                      const std::string& labels = "RED,BLUE") const {
    return {"train", "--task", "classify", "--labels", labels, "--config", path("config.json"), "--data", data,
            "--out", out, "--steps", "4", "--batch", "8", "--seq", "16", "--no-progress"};
  }
  // A trained head model (a few steps: the tests need its format, not its accuracy).
  std::string head_model() {
    const std::string out = path("head");
    auto args = train_args(path("train.jsonl"), out);
    args.insert(args.end(), {"--dev", path("dev.jsonl"), "--template", "colour: {text}"});
    const CliResult r = run_corelm(args, opts());
    EXPECT_EQ(r.rc, 0) << r.all();
    return out;
  }
  static CliOptions opts() {
    CliOptions o;
    o.timeout_s = 60;
    return o;
  }
  fs::path root_;
};

TEST_F(PosttrainFaultTest, RecordWithAnUnknownLabelNamesFileAndLine) {
  write_text(path("bad.jsonl"), records(5, 3) + "\n" + R"({"text": "green grass", "label": "GREEN"})" + "\n");
  const CliResult r = run_corelm(train_args(path("bad.jsonl"), path("out")), opts());
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find(path("bad.jsonl") + ":7: label 'GREEN' is not one of --labels (RED,BLUE)"), std::string::npos)
      << r.err;
  // The same in a --dev file.
  auto args = train_args(path("train.jsonl"), path("out2"));
  args.insert(args.end(), {"--dev", path("bad.jsonl")});
  const CliResult d = run_corelm(args, opts());
  EXPECT_EQ(d.rc, 1);
  EXPECT_NE(d.err.find(path("bad.jsonl") + ":7: label 'GREEN'"), std::string::npos) << d.err;
}

TEST_F(PosttrainFaultTest, EmptyDataIsRefused) {
  write_text(path("empty.jsonl"), "\n\n");
  const CliResult r = run_corelm(train_args(path("empty.jsonl"), path("out")), opts());
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find(path("empty.jsonl") + ": no records (empty data)"), std::string::npos) << r.err;
}

TEST_F(PosttrainFaultTest, SingleClassDataIsRefusedNamingTheMissingLabels) {
  write_text(path("red.jsonl"), records(40, 4, true));
  const CliResult r = run_corelm(train_args(path("red.jsonl"), path("out")), opts());
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("holds training records of only 1 of the 2 labels (missing: BLUE)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("out") + "/model.safetensors"));
}

// --teacher-field: the records' teacher distributions train the head (the summary names the field
// and the weight; the dev file needs none), and a record without one, a weight outside [0, 1], a
// weight without a teacher or the option without --task classify are refused naming the line or
// the option.
TEST_F(PosttrainFaultTest, TeacherFieldTrainsAndBadTeachersAreRefused) {
  std::string taught;
  std::istringstream in(records(24, 9));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    const bool red = j["label"] == "RED";
    j["probs"] = {{"RED", red ? 0.8 : 0.3}, {"BLUE", red ? 0.2 : 0.7}};
    taught += j.dump() + "\n";
  }
  write_text(path("taught.jsonl"), taught);
  auto args = train_args(path("taught.jsonl"), path("t1"));
  args.insert(args.end(), {"--dev", path("dev.jsonl"), "--teacher-field", "probs", "--distill-weight", "0.7"});
  CliResult r = run_corelm(args, opts());
  ASSERT_EQ(r.rc, 0) << r.all();
  const nlohmann::json summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["teacher_field"], "probs");
  EXPECT_DOUBLE_EQ(summary["distill_weight"].get<double>(), 0.7);
  // A record without the field names its line and the option.
  write_text(path("half.jsonl"), taught + R"({"text": "red rose", "label": "RED"})" + "\n");
  args = train_args(path("half.jsonl"), path("t2"));
  args.insert(args.end(), {"--teacher-field", "probs"});
  r = run_corelm(args, opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find(path("half.jsonl") + ":25: missing field \"probs\" (--teacher-field)"), std::string::npos)
      << r.err;
  args = train_args(path("taught.jsonl"), path("t3"));
  args.insert(args.end(), {"--teacher-field", "probs", "--distill-weight", "1.5"});
  r = run_corelm(args, opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--distill-weight must be in [0, 1]"), std::string::npos) << r.err;
  r = run_corelm({"train", "--data", path("train.jsonl"), "--out", path("t4"), "--steps", "2", "--teacher-field",
                  "probs"},
                 opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--teacher-field and --data-seed are for --task classify"), std::string::npos) << r.err;
  // A weight without a teacher would change nothing: refused before anything is read or written.
  args = train_args(path("taught.jsonl"), path("t5"));
  args.insert(args.end(), {"--distill-weight", "0.3"});
  r = run_corelm(args, opts());
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--distill-weight requires --teacher-field"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("t5")));
}

// --data-seed: the seed of the batch order alone. Fine-tunes that differ only in it start from the
// same weights -- at a learning rate too small to move any fp32 weight the saved model is the
// initialisation, equal across data seeds and not across --seed -- and train differently at a
// real rate; without it the order follows --seed as before. Refused without --task classify.
TEST_F(PosttrainFaultTest, DataSeedChangesTheBatchOrderAndNotTheInitialWeights) {
  auto weights = [&](const std::string& out, const std::vector<std::string>& extra) {
    auto args = train_args(path("train.jsonl"), path(out));
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_corelm(args, opts());
    EXPECT_EQ(r.rc, 0) << r.all();
    return slurp(path(out) + "/model.safetensors");
  };
  const std::string init = weights("i0", {"--lr", "1e-30", "--seed", "3"});
  ASSERT_FALSE(init.empty());
  EXPECT_EQ(weights("i1", {"--lr", "1e-30", "--seed", "3", "--data-seed", "4"}), init);
  EXPECT_NE(weights("i2", {"--lr", "1e-30", "--seed", "5", "--data-seed", "4"}), init);
  const std::string trained = weights("t0", {"--seed", "3"});
  EXPECT_NE(trained, init);
  EXPECT_EQ(weights("t1", {"--seed", "3", "--data-seed", "3"}), trained);
  EXPECT_NE(weights("t2", {"--seed", "3", "--data-seed", "4"}), trained);
  auto args = train_args(path("train.jsonl"), path("t3"));
  args.insert(args.end(), {"--data-seed", "4"});
  CliResult r = run_corelm(args, opts());
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_EQ(nlohmann::json::parse(r.out)["data_seed"], 4);
  r = run_corelm({"train", "--data", path("train.jsonl"), "--out", path("t4"), "--steps", "2", "--data-seed", "4"},
                 opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--data-seed are for --task classify"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("t4") + "/model.safetensors"));
}

// bench/teacher_probs.py (round 3's soft targets): TRAIN comes back with each record's fields and
// the mean of the teachers' probabilities (checked against each teacher alone), which training reads
// with --teacher-field; a teacher over other labels stops it naming the model.
TEST_F(PosttrainFaultTest, TeacherProbsWritesTheEnsembleMeanThatTrainingReads) {
  const std::string script = std::string(CORELM_SOURCE_DIR) + "/bench/teacher_probs.py";
  const std::string bin = std::string(CORELM_BINARY_DIR) + "/corelm";
  for (const std::string seed : {"1", "2"}) {
    auto args = train_args(path("train.jsonl"), path("h" + seed));
    args.insert(args.end(), {"--seed", seed});
    ASSERT_EQ(run_corelm(args, opts()).rc, 0);
  }
  auto probs = [&](const std::vector<std::string>& models, const std::string& out) {
    std::vector<std::string> a = {script, "--train", path("train.jsonl"), "--out", path(out), "--corelm", bin, "--models"};
    a.insert(a.end(), models.begin(), models.end());
    return run_program("python3", a, opts());
  };
  ASSERT_EQ(probs({path("h1"), path("h2")}, "both.jsonl").rc, 0);
  ASSERT_EQ(probs({path("h1")}, "one.jsonl").rc, 0);
  ASSERT_EQ(probs({path("h2")}, "two.jsonl").rc, 0);
  std::ifstream src(path("train.jsonl")), both(path("both.jsonl")), one(path("one.jsonl")), two(path("two.jsonl"));
  std::string ls, lb, l1, l2;
  int n = 0;
  while (std::getline(src, ls)) {
    ASSERT_TRUE(std::getline(both, lb) && std::getline(one, l1) && std::getline(two, l2));
    const auto o = nlohmann::json::parse(ls), b = nlohmann::json::parse(lb);
    const auto a1 = nlohmann::json::parse(l1)["teacher"], a2 = nlohmann::json::parse(l2)["teacher"];
    EXPECT_EQ(b["text"], o["text"]);
    EXPECT_EQ(b["label"], o["label"]);
    ASSERT_EQ(b["teacher"].size(), 2u);
    for (const char* l : {"RED", "BLUE"})
      EXPECT_NEAR(b["teacher"][l].get<double>(), (a1[l].get<double>() + a2[l].get<double>()) / 2, 1e-9);
    EXPECT_NEAR(b["teacher"]["RED"].get<double>() + b["teacher"]["BLUE"].get<double>(), 1.0, 1e-6);
    EXPECT_NE(a1["RED"].get<double>(), a2["RED"].get<double>());  // two different teachers
    ++n;
  }
  EXPECT_EQ(n, 120);
  auto args = train_args(path("both.jsonl"), path("student"));
  args.insert(args.end(), {"--teacher-field", "teacher"});
  EXPECT_EQ(run_corelm(args, opts()).rc, 0);
  // A teacher over other labels.
  ASSERT_EQ(run_corelm(train_args(path("train.jsonl"), path("h3"), "RED,BLUE,GREEN"), opts()).rc, 0);
  const CliResult r = probs({path("h1"), path("h3")}, "mixed.jsonl");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find(path("h3") + " has labels"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("mixed.jsonl")));
}

TEST_F(PosttrainFaultTest, OneLabelAndBadOptionsAreRefused) {
  CliResult r = run_corelm(train_args(path("train.jsonl"), path("o1"), "RED"), opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--labels needs at least two labels"), std::string::npos) << r.err;
  auto args = train_args(path("train.jsonl"), path("o2"));
  args.insert(args.end(), {"--label-smoothing", "1.5"});
  r = run_corelm(args, opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--label-smoothing must be in [0, 1)"), std::string::npos) << r.err;
  args = train_args(path("train.jsonl"), path("o3"));
  args.insert(args.end(), {"--epochs", "2"});
  r = run_corelm(args, opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--steps and --epochs are exclusive"), std::string::npos) << r.err;
  r = run_corelm({"train", "--data", path("train.jsonl"), "--out", path("o4")}, opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--steps is required"), std::string::npos) << r.err;
  r = run_corelm({"train", "--data", path("train.jsonl"), "--out", path("o5"), "--steps", "2", "--labels", "A,B"},
                 opts());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("are for --task classify"), std::string::npos) << r.err;
}

TEST_F(PosttrainFaultTest, RunClassifyUsesTheHeadItsLabelsAndItsTemplate) {
  const std::string model = head_model();
  write_text(path("in.jsonl"), records(20, 5));
  const CliResult r = run_corelm({"run", "classify", "--model", model, "--input", path("in.jsonl"), "--out",
                                  path("run"), "--precision", "f32"},
                                 opts());
  ASSERT_EQ(r.rc, 0) << r.all();
  const nlohmann::json run = nlohmann::json::parse(std::ifstream(path("run") + "/run.json"));
  EXPECT_EQ(run["task"]["labels"], nlohmann::json({"RED", "BLUE"}));
  EXPECT_EQ(run["task"]["template"], "colour: {text}");
  // The probabilities are the head's: softmax(score(last hidden) / T) over the same prompt.
  const model::LoadedModel m = model::load_model_dir(model);
  train::ClassifyDataOptions d;
  d.labels = {"RED", "BLUE"};
  d.template_text = "colour: {text}";
  const auto recs = train::load_classify_records(path("in.jsonl"), *m.tokenizer, d);
  const auto logits = train::classify_logits(m.decoder, recs, 0);
  const double T = m.decoder.config().classifier_temperature;
  std::ifstream part(path("run") + "/part-00000000.jsonl");
  std::string line;
  size_t i = 0;
  for (; std::getline(part, line); ++i) {
    ASSERT_LT(i, recs.size());
    const nlohmann::json j = nlohmann::json::parse(line);
    const double z0 = logits[i][0] / T, z1 = logits[i][1] / T;
    const double p_red = 1 / (1 + std::exp(z1 - z0));
    EXPECT_NEAR(j["probs"]["RED"].get<double>(), p_red, 1e-4) << line;
  }
  EXPECT_EQ(i, recs.size());
  // A reordered set is allowed: the probabilities follow --labels' order, the values are the same.
  const CliResult re = run_corelm({"run", "classify", "--model", model, "--input", path("in.jsonl"), "--out",
                                   path("run2"), "--labels", "BLUE,RED", "--precision", "f32"},
                                  opts());
  ASSERT_EQ(re.rc, 0) << re.all();
  std::ifstream a(path("run") + "/part-00000000.jsonl"), b(path("run2") + "/part-00000000.jsonl");
  std::string la, lb;
  ASSERT_TRUE(std::getline(a, la) && std::getline(b, lb));
  const nlohmann::json ja = nlohmann::json::parse(la), jb = nlohmann::json::parse(lb);
  EXPECT_EQ(ja["label"], jb["label"]);
  EXPECT_NEAR(ja["probs"]["RED"].get<double>(), jb["probs"]["RED"].get<double>(), 1e-12);
  EXPECT_EQ(jb["probs"].begin().key(), "BLUE");
}

TEST_F(PosttrainFaultTest, LabelsThatAreNotTheHeadsAreRefusedNamingBothSets) {
  const std::string model = head_model();
  write_text(path("in.jsonl"), records(5, 6));
  const CliResult r = run_corelm({"run", "classify", "--model", model, "--input", path("in.jsonl"), "--out",
                                  path("run"), "--labels", "RED,GREEN"},
                                 opts());
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("--labels (RED,GREEN) do not match the model's classification head (RED,BLUE): 'GREEN'"),
            std::string::npos)
      << r.err;
  const CliResult e = run_corelm({"eval-task", "--model", model, "--data", path("in.jsonl"), "--task", "classify",
                                  "--labels", "RED,BLUE,GREEN", "--json"},
                                 opts());
  EXPECT_EQ(e.rc, 1) << e.all();
  EXPECT_NE(e.err.find("do not match the model's classification head (RED,BLUE)"), std::string::npos) << e.err;
  // eval-task with the head's own labels (by default) works.
  const CliResult ok = run_corelm({"eval-task", "--model", model, "--data", path("in.jsonl"), "--task", "classify",
                                   "--json"},
                                  opts());
  EXPECT_EQ(ok.rc, 0) << ok.all();
  EXPECT_NE(ok.out.find("\"accuracy\""), std::string::npos) << ok.out;
  // A second round (--init the head model) over other labels needs them given; the head restarts.
  auto args = train_args(path("train.jsonl"), path("round2"), "BLUE,RED");
  args.insert(args.end(), {"--init", model});
  args.erase(args.begin() + 5, args.begin() + 7);  // no --config with --init
  const CliResult r2 = run_corelm(args, opts());
  EXPECT_EQ(r2.rc, 0) << r2.all();
}

TEST_F(PosttrainFaultTest, HeadModelGivenToLanguageModelTrainingIsRefused) {
  const std::string model = head_model();
  write_text(path("text.txt"), "red apple cherry rose blue sky sea ocean\n");
  const CliResult r =
      run_corelm({"train", "--init", model, "--data", path("text.txt"), "--out", path("lm"), "--steps", "2"}, opts());
  EXPECT_EQ(r.rc, 1) << r.all();
  EXPECT_NE(r.err.find("has a classification head (2 labels); language-model training"), std::string::npos) << r.err;
}

// corelm merge through the binary: two rounds from one head model average into a head model that
// eval-task runs; a second tokenizer, a head-less model with --dev, greedy without --dev and a
// single model are refused with the reason.
TEST_F(PosttrainFaultTest, MergeAveragesHeadsAndRefusesWhatCannotAverage) {
  const std::string model = head_model();
  auto args = train_args(path("train.jsonl"), path("round2"));
  args.insert(args.end(), {"--init", model, "--dev", path("dev.jsonl"), "--lr", "1e-3"});
  args.erase(args.begin() + 5, args.begin() + 7);  // no --config with --init
  ASSERT_EQ(run_corelm(args, opts()).rc, 0);
  const CliResult m = run_corelm({"merge", model, path("round2"), "--dev", path("dev.jsonl"), "--max-tokens", "16",
                                  "--out", path("soup"), "--json"},
                                 opts());
  ASSERT_EQ(m.rc, 0) << m.all();
  const auto j = nlohmann::json::parse(m.out);
  EXPECT_EQ(j.at("method"), "greedy");
  EXPECT_EQ(j.at("models").size(), 2u);
  EXPECT_GE(j.at("kept").get<int>(), 1);
  EXPECT_GT(j.at("temperature").get<double>(), 0);
  write_text(path("in.jsonl"), records(5, 6));
  const CliResult ev = run_corelm({"eval-task", "--model", path("soup"), "--data", path("in.jsonl"), "--json"}, opts());
  EXPECT_EQ(ev.rc, 0) << ev.all();

  // The same directory twice: the second is counted once, with a warning and duplicate_of.
  const CliResult twice = run_corelm({"merge", model, path("round2"), model, "--dev", path("dev.jsonl"),
                                      "--max-tokens", "16", "--out", path("soup2"), "--json"},
                                     opts());
  ASSERT_EQ(twice.rc, 0) << twice.all();
  EXPECT_NE(twice.err.find("warning: " + model + " has the same weights as " + model), std::string::npos)
      << twice.err;
  const auto j2 = nlohmann::json::parse(twice.out);
  ASSERT_EQ(j2.at("models").size(), 3u);
  EXPECT_EQ(j2.at("models")[2].at("duplicate_of"), model);
  EXPECT_FALSE(j2.at("models")[2].at("kept").get<bool>());
  EXPECT_EQ(j2.at("dev_accuracy"), j.at("dev_accuracy"));
  const CliResult same = run_corelm({"merge", model, model, "--out", path("x")}, opts());
  EXPECT_EQ(same.rc, 1) << same.all();
  EXPECT_NE(same.err.find("fewer than two distinct models"), std::string::npos) << same.err;

  const CliResult one = run_corelm({"merge", model, "--out", path("x")}, opts());
  EXPECT_NE(one.rc, 0);
  const CliResult greedy = run_corelm({"merge", model, path("round2"), "--method", "greedy", "--out", path("x")}, opts());
  EXPECT_EQ(greedy.rc, 1) << greedy.all();
  EXPECT_NE(greedy.err.find("give --dev DEV.jsonl"), std::string::npos) << greedy.err;
  // A model trained with its own tokenizer (the default: a BPE of the records' text, here of others).
  std::string other = records(120, 9);
  for (size_t at; (at = other.find("apple")) != std::string::npos;) other.replace(at, 5, "plum");
  for (size_t at; (at = other.find("ocean")) != std::string::npos;) other.replace(at, 5, "cloud");
  write_text(path("other.jsonl"), other);
  ASSERT_EQ(run_corelm(train_args(path("other.jsonl"), path("other")), opts()).rc, 0);
  const CliResult tok = run_corelm({"merge", model, path("other"), "--out", path("x")}, opts());
  EXPECT_EQ(tok.rc, 1) << tok.all();
  EXPECT_NE(tok.err.find("other/tokenizer.json differs from"), std::string::npos) << tok.err;
  EXPECT_FALSE(fs::exists(path("x")));
}

}  // namespace
}  // namespace corelm::testing
