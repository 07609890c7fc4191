// The three tasks through pipeline::run in-process: batch invariance (batch 1 vs 32 gives the
// same bytes), classify's probabilities, constrained extraction, scoring against a direct
// forward, and sharding (the union of shards equals the full run).
#include <gtest/gtest.h>

#include <cmath>

#include "corelm/error.h"
#include "pipeline_fixture.h"

namespace corelm::testing {
namespace {

TEST_F(PipelineTest, ClassifyIsBatchInvariantAndProbabilitiesAreNormalised) {
  write_text(path("in.jsonl"), corpus_jsonl(80, 60, 1));
  // Both numerics paths: the f32 reference ops and the bf16 fast path.
  auto f32 = classify_options(path("in.jsonl"), path("f32_b1"));
  f32.precision = "f32";
  f32.batch = 1;
  pipeline::run(f32);
  f32.out = path("f32_b32");
  f32.batch = 32;
  pipeline::run(f32);
  EXPECT_EQ(read_parts(path("f32_b1")), read_parts(path("f32_b32")));
  auto o = classify_options(path("in.jsonl"), path("b1"));
  o.batch = 1;
  const pipeline::RunSummary s1 = pipeline::run(o);
  o.out = path("b32");
  o.batch = 32;
  const pipeline::RunSummary s32 = pipeline::run(o);
  const std::string a = read_parts(path("b1")), b = read_parts(path("b32"));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, read_parts(path("f32_b1"))) << "bf16 and f32 should differ somewhere in the probabilities";
  o.out = path("t2");
  o.threads = 2;  // thread invariance too
  pipeline::run(o);
  EXPECT_EQ(read_parts(path("t2")), a);
  EXPECT_EQ(s1.records, 80);
  EXPECT_EQ(s1.errors, 0);
  EXPECT_TRUE(s1.complete);
  EXPECT_EQ(s1.input_tokens, s32.input_tokens);
  const auto lines = parse_lines(a);
  ASSERT_EQ(lines.size(), 80u);
  int truncated = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& j = lines[i];
    EXPECT_EQ(j["id"], path("in.jsonl") + ":" + std::to_string(i + 1));
    double sum = 0, best = -1, second = -1;
    std::string arg;
    for (const auto& [label, p] : j["probs"].items()) {
      const double v = p.get<double>();
      sum += v;
      if (v > best) second = best, best = v, arg = label;
      else if (v > second) second = v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-9);
    EXPECT_EQ(j["label"], arg);
    EXPECT_NEAR(j["margin"].get<double>(), best - second, 1e-12);
    truncated += j.value("truncated", false);
  }
  EXPECT_GT(truncated, 0) << "the corpus should exercise the over-context policy";
  const auto manifest = nlohmann::json::parse(slurp(path("b1") + "/manifest.json"));
  for (const char* key : {"records", "errors", "input_tokens", "seconds", "tokens_per_s", "model_hash", "task_hash"})
    EXPECT_TRUE(manifest.contains(key)) << key;
  EXPECT_EQ(manifest["records"], 80);
}

TEST_F(PipelineTest, MultiTokenLabelsMatchADirectForward) {
  // Labels of several tokens take the copy-the-document-KV path; check one record by hand.
  write_text(path("in.jsonl"), "{\"text\": \"the cat sat on a mat\"}\n");
  auto o = classify_options(path("in.jsonl"), path("out"));
  o.task.labels = {"market prices", "x", "quiet night river"};
  o.precision = "f32";  // compared with the reference forward below
  pipeline::run(o);
  const auto lines = parse_lines(read_parts(path("out")));
  ASSERT_EQ(lines.size(), 1u);
  auto loaded = model::load_model_dir(model_);
  const Tokenizer& tok = *loaded.tokenizer;
  std::vector<double> ll;
  for (const auto& label : o.task.labels) {
    std::vector<TokenId> prompt = tok.encode("the cat sat on a mat\nLabel:");
    const std::vector<TokenId> cont = tok.encode(" " + label);
    std::vector<TokenId> all = prompt;
    all.insert(all.end(), cont.begin(), cont.end());
    std::vector<int64_t> ids(all.begin(), all.end());
    Tensor logits = loaded.decoder.forward(Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())})).contiguous();
    const int64_t V = logits.size(2);
    double total = 0;
    for (size_t t = 0; t < cont.size(); ++t) {
      const float* row = logits.data<float>() + (prompt.size() - 1 + t) * V;
      double m = -INFINITY, z = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max<double>(m, row[v]);
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - m);
      total += row[cont[t]] - m - std::log(z);
    }
    ll.push_back(total);
  }
  double m = *std::max_element(ll.begin(), ll.end()), z = 0;
  for (double v : ll) z += std::exp(v - m);
  for (size_t j = 0; j < ll.size(); ++j)
    EXPECT_NEAR(lines[0]["probs"][o.task.labels[j]].get<double>(), std::exp(ll[j] - m) / z, 1e-4) << o.task.labels[j];
}

TEST_F(PipelineTest, ExtractAndScoreAreBatchInvariant) {
  write_text(path("in.jsonl"), corpus_jsonl(40, 30, 2));
  for (const std::string mode : {"greedy", "choices", "regex", "score", "score_f32", "greedy_f32"}) {
    std::string out[2];
    for (int k = 0; k < 2; ++k) {
      pipeline::RunOptions o;
      o.model = model_;
      o.inputs = {path("in.jsonl")};
      o.out = path(mode + std::to_string(k));
      o.batch = k == 0 ? 1 : 32;
      o.chunk_records = 16;
      o.task.kind = mode.starts_with("score") ? pipeline::TaskKind::Score : pipeline::TaskKind::Extract;
      if (mode.ends_with("_f32")) o.precision = "f32";
      o.task.max_tokens = 12;
      if (mode == "choices") o.task.choices = {" yes", " no", " maybe not"};
      if (mode == "regex") o.task.regex = " [a-z]+( [0-9]{1,2})?";
      pipeline::run(o);
      out[k] = read_parts(o.out);
    }
    ASSERT_FALSE(out[0].empty()) << mode;
    EXPECT_EQ(out[0], out[1]) << mode;
    for (const auto& j : parse_lines(out[0])) {
      if (mode.starts_with("score")) {
        EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(-j["mean_logprob"].get<double>()), 1e-9);
        EXPECT_GE(j["tokens"].get<int64_t>(), 1);
        continue;
      }
      EXPECT_LE(j["logprob"].get<double>(), 0.0);
      const std::string text = j["text"];
      if (mode == "choices") {
        EXPECT_TRUE(text == " yes" || text == " no" || text == " maybe not") << text;
      }
      if (mode == "regex" && j["finish_reason"] == "stop") {
        EXPECT_EQ(text[0], ' ');
      }
    }
  }
}

TEST_F(PipelineTest, ShardsUnionEqualsTheFullRun) {
  write_text(path("a.jsonl"), corpus_jsonl(50, 20, 3));
  write_text(path("b.jsonl"), corpus_jsonl(30, 20, 4));
  auto o = classify_options(path("*.jsonl"), path("full"));
  pipeline::run(o);
  const std::string full = read_parts(path("full"));
  o.out = path("sharded");
  o.shard_count = 3;
  int64_t parts = 0;
  for (int i = 0; i < 3; ++i) {
    o.shard_index = i;
    parts += pipeline::run(o).chunks_run;
  }
  EXPECT_EQ(parts, 6);  // 50 + 30 records in chunks of 16: 4 + 2 chunks, each run by one shard
  EXPECT_EQ(read_parts(path("sharded")), full);
  EXPECT_EQ(parse_lines(full).size(), 80u);
  const auto manifest = nlohmann::json::parse(slurp(path("sharded") + "/manifest.json"));
  EXPECT_EQ(manifest["records"], 80);
  EXPECT_EQ(manifest["complete"], true);
}

TEST_F(PipelineTest, RerunSkipsCommittedChunksAndOtherTasksAreRefused) {
  write_text(path("in.jsonl"), corpus_jsonl(40, 10, 5));
  auto o = classify_options(path("in.jsonl"), path("out"));
  EXPECT_EQ(pipeline::run(o).chunks_run, 3);
  const std::string first = read_parts(path("out"));
  EXPECT_EQ(pipeline::run(o).chunks_run, 0);
  // A lost part (e.g. deleted by hand) is redone even though the journal lists it.
  fs::remove(path("out") + "/part-00000001.jsonl");
  EXPECT_EQ(pipeline::run(o).chunks_run, 1);
  EXPECT_EQ(read_parts(path("out")), first);
  auto other = o;
  other.task.labels = {"a", "b"};
  EXPECT_THROW(pipeline::run(other), ValueError);
  other.overwrite = true;
  EXPECT_EQ(pipeline::run(other).chunks_run, 3);
  // --overwrite removes the other run's parts: one bigger chunk leaves one part file.
  other.chunk_records = 64;
  EXPECT_EQ(pipeline::run(other).chunks_run, 1);
  EXPECT_EQ(read_parts(path("out")), slurp(path("out") + "/part-00000000.jsonl"));
  EXPECT_FALSE(fs::exists(path("out") + "/part-00000001.jsonl"));
  // Changed inputs under an existing output are a different run too.
  other.overwrite = false;
  write_text(path("in.jsonl"), corpus_jsonl(41, 10, 5));
  EXPECT_THROW(pipeline::run(other), ValueError);
}

TEST_F(PipelineTest, TemplatePrefixIsReusedWithoutChangingResults) {
  // A long template prefix is computed once; results equal a template-free prompt built by hand.
  write_text(path("in.jsonl"), corpus_jsonl(20, 8, 6));
  auto o = classify_options(path("in.jsonl"), path("out"));
  o.task.template_text = "Classify the text below.\nText: {text}\nLabel:";
  pipeline::run(o);
  const auto with_prefix = parse_lines(read_parts(path("out")));
  // The same prompts with the prefix moved into the record text: nothing to reuse.
  std::string moved;
  for (const auto& j : parse_lines(slurp(path("in.jsonl"))))
    moved += nlohmann::json{{"text", "Classify the text below.\nText: " + j["text"].get<std::string>()}}.dump() + "\n";
  write_text(path("moved.jsonl"), moved);
  auto m = classify_options(path("moved.jsonl"), path("out2"));
  m.task.template_text = "{text}\nLabel:";
  pipeline::run(m);
  const auto without = parse_lines(read_parts(path("out2")));
  ASSERT_EQ(with_prefix.size(), without.size());
  for (size_t i = 0; i < without.size(); ++i)
    for (const auto& label : o.task.labels)
      EXPECT_NEAR(with_prefix[i]["probs"][label].get<double>(), without[i]["probs"][label].get<double>(), 1e-5);
}

}  // namespace
}  // namespace corelm::testing
