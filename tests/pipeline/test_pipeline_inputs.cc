// Input handling: compressed files, field lookup, and every kind of bad input becoming a clear
// error or an error record while the rest of the run goes on (nothing lost).
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include "corelm/error.h"
#include "infer/regex_nfa.h"
#include "pipeline_fixture.h"

namespace corelm::testing {
namespace {

TEST_F(PipelineTest, GzipAndZstdInputsGiveTheSameOutput) {
  const std::string text = corpus_jsonl(30, 12, 8);
  write_text(path("plain.jsonl"), text);
  gzFile gz = gzopen(path("c.jsonl.gz").c_str(), "wb");
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
  gzclose(gz);
  std::string z(ZSTD_compressBound(text.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), text.data(), text.size(), 3));
  write_text(path("c.jsonl.zst"), z);
  std::string outs[3];
  const char* inputs[] = {"plain.jsonl", "c.jsonl.gz", "c.jsonl.zst"};
  for (int k = 0; k < 3; ++k) {
    auto o = classify_options(path(inputs[k]), path("out" + std::to_string(k)));
    o.task.id_field = "id";
    o.chunk_records = 7;  // several chunks: the reader skips into compressed files
    pipeline::run(o);
    outs[k] = read_parts(o.out);
  }
  ASSERT_EQ(parse_lines(outs[0]).size(), 30u);
  EXPECT_EQ(parse_lines(outs[0])[3]["id"], "r3");
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

TEST_F(PipelineTest, BadRecordsBecomeErrorRecordsAndTheRunContinues) {
  std::string in;
  in += "{\"text\": \"the cat sat\"}\n";                 // 1 ok
  in += "{\"text\": \"the cat\"\n";                      // 2 invalid JSON
  in += "{\"body\": \"no text field\"}\n";               // 3 missing field
  in += "{\"text\": \"caf\xe9 bytes\"}\n";               // 4 not UTF-8
  in += "{\"text\": \"" + std::string(5000, 'a') + "\"}\n";  // 5 enormous (limit below)
  in += "\n";                                            // 6 blank: not a record
  in += "[1, 2]\n";                                      // 7 not an object
  in += "{\"text\": 42}\n";                              // 8 text not a string
  in += "{\"meta\": {\"body\": \"dog ran fast\"}}\n";    // 9 ok via a JSON pointer? (no: text_field)
  in += "{\"text\": \"rose team won\"}";                 // 10 ok, no final newline
  write_text(path("in.jsonl"), in);
  write_text(path("empty.jsonl"), "");
  auto o = classify_options(path("in.jsonl"), path("out"));
  o.inputs.push_back(path("empty.jsonl"));
  o.max_line_bytes = 1000;
  o.chunk_records = 4;
  const pipeline::RunSummary s = pipeline::run(o);
  EXPECT_EQ(s.records, 2);
  EXPECT_EQ(s.errors, 7);
  const auto ok = parse_lines(read_parts(path("out")));
  const auto errors = parse_lines(read_parts(path("out"), "errors-"));
  ASSERT_EQ(ok.size(), 2u);
  ASSERT_EQ(errors.size(), 7u);
  std::map<int64_t, std::string> reason;
  for (const auto& e : errors) {
    EXPECT_EQ(e["file"], path("in.jsonl"));
    reason[e["line"].get<int64_t>()] = e["reason"];
  }
  EXPECT_NE(reason[2].find("invalid JSON"), std::string::npos) << reason[2];
  EXPECT_NE(reason[3].find("missing text field 'text'"), std::string::npos) << reason[3];
  EXPECT_NE(reason[4].find("UTF-8"), std::string::npos) << reason[4];
  EXPECT_NE(reason[5].find("--max-line-bytes"), std::string::npos) << reason[5];
  EXPECT_NE(reason[7].find("expected a JSON object"), std::string::npos) << reason[7];
  EXPECT_NE(reason[8].find("not a string"), std::string::npos) << reason[8];
  EXPECT_NE(reason[9].find("missing text field"), std::string::npos) << reason[9];
  EXPECT_EQ(ok[0]["id"], path("in.jsonl") + ":1");
  EXPECT_EQ(ok[1]["id"], path("in.jsonl") + ":10");
  const auto manifest = nlohmann::json::parse(slurp(path("out") + "/manifest.json"));
  EXPECT_EQ(manifest["empty_inputs"][0], path("empty.jsonl"));

  // A JSON pointer reaches nested fields; --truncate error turns long documents into error records.
  auto p = classify_options(path("in.jsonl"), path("out_ptr"));
  p.task.text_field = "/meta/body";
  p.max_line_bytes = 1000;
  EXPECT_EQ(pipeline::run(p).records, 1);
  write_text(path("long.jsonl"), corpus_jsonl(20, 60, 9));
  auto t = classify_options(path("long.jsonl"), path("out_long"));
  t.task.truncate = pipeline::Truncate::Error;
  const auto st = pipeline::run(t);
  EXPECT_GT(st.errors, 0);
  EXPECT_EQ(st.records + st.errors, 20);
  EXPECT_NE(read_parts(path("out_long"), "errors-").find("--truncate error"), std::string::npos);
}

TEST_F(PipelineTest, ClearErrorsForUnusableInputsAndOutputs) {
  write_text(path("empty.jsonl"), "");
  auto o = classify_options(path("empty.jsonl"), path("out"));
  try {
    pipeline::run(o);
    FAIL() << "an input with no lines must be an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("hold no lines"), std::string::npos) << e.what();
  }
  o.inputs = {path("missing-*.jsonl")};
  EXPECT_THROW(pipeline::run(o), IOError);
  write_text(path("in.jsonl"), corpus_jsonl(3, 5, 1));
  write_text(path("a_file"), "x");
  o.inputs = {path("in.jsonl")};
  o.out = path("a_file") + "/out";  // a path under a regular file can never be created
  try {
    pipeline::run(o);
    FAIL() << "an unwritable --out must be an error";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("--out"), std::string::npos) << e.what();
  }
  o.out = path("out");
  o.task.labels = {"only"};
  EXPECT_THROW(pipeline::run(o), ValueError);
  o.task.labels = {"a", "b"};
  o.task.template_text = "no placeholder";
  EXPECT_THROW(pipeline::run(o), ValueError);
}

TEST(PipelineRegex, ViablePrefixesAndFullMatches) {
  using infer::Regex;
  const Regex re = Regex::compile("[A-Z][a-z]+ (\\d{2,3}|none)");
  auto feed = [&](const std::string& s, bool& full) {
    Regex::State st = re.start();
    const bool viable = re.advance(st, s);
    full = viable && re.accepts(st);
    return viable;
  };
  bool full = false;
  EXPECT_TRUE(feed("Ab", full));
  EXPECT_FALSE(full);
  EXPECT_TRUE(feed("Abc 1", full));
  EXPECT_FALSE(full);
  EXPECT_TRUE(feed("Abc 12", full));
  EXPECT_TRUE(full);
  EXPECT_TRUE(feed("Abc 123", full));
  EXPECT_TRUE(full);
  EXPECT_FALSE(feed("Abc 1234", full));
  EXPECT_TRUE(feed("Abc no", full));
  EXPECT_TRUE(feed("Abc none", full));
  EXPECT_TRUE(full);
  EXPECT_FALSE(feed("abc", full));
  EXPECT_FALSE(feed("A1", full));
  const Regex opt = Regex::compile("a*b?(c|d)+[^x]");
  Regex::State st = opt.start();
  EXPECT_TRUE(opt.advance(st, "aaabcdcy"));
  EXPECT_TRUE(opt.accepts(st));
  EXPECT_THROW(Regex::compile("(ab"), ValueError);
  EXPECT_THROW(Regex::compile("a{3,1}"), ValueError);
  EXPECT_THROW(Regex::compile("*a"), ValueError);
  EXPECT_THROW(Regex::compile("^a$"), ValueError);
}

}  // namespace
}  // namespace corelm::testing
