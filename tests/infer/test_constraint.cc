// Constrained decoding (corelm/constraint.h): the grammars on byte strings, the vocabulary mask
// against a brute-force per-token check, and sampled decoding under random logits that must
// always end complete within its token budget, checked by independent parsers (nlohmann::json,
// std::regex, a walk of the parsed JSON against the schema).
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/generate_fixtures.h"
#include "corelm/constraint.h"
#include "corelm/error.h"
#include "corelm/tokenizer.h"

namespace corelm::infer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kNoBudget = std::numeric_limits<int64_t>::max() / 4;

bool matches(const Grammar& g, const std::string& s) {
  auto st = g.start();
  return st->advance(s) && st->accepts();
}
bool viable(const Grammar& g, const std::string& s) { return g.start()->advance(s); }

// A byte-level BPE trained in the test (every byte is a token) on text with JSON-ish pieces, so
// merges such as `":` and ` "` exist, as in real vocabularies.
class ConstraintTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::path dir = fs::temp_directory_path() / ("corelm_constraint_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::vector<std::string> words = {"{\"name\": \"",  "\"age\": ", "12", "true", "false", "null", "},",
                                            "[1, 2]",         "\"x\"",     "café", "日本", "\\n",  "yes", "no",
                                            "{\"a\": {\"b\": [", "]}",     "-3.5e2", "abc", "42"};
    tok_ = testing::train_small_bpe(dir, testing::pseudo_text(words, 7, 4000, 9), 400).release();
    fs::remove_all(dir);
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static Tokenizer* tok_;
};
Tokenizer* ConstraintTest::tok_ = nullptr;

// ---- grammars on strings ---------------------------------------------------------------------

TEST(ConstraintGrammar, RegexAcceptsAndRejects) {
  auto g = Grammar::regex("[A-Z][a-z]+ (\\d{2,3}|none)");
  EXPECT_TRUE(matches(*g, "Alice 42"));
  EXPECT_TRUE(matches(*g, "Bob none"));
  EXPECT_FALSE(matches(*g, "Bob 4"));
  EXPECT_TRUE(viable(*g, "Bob 4"));
  EXPECT_FALSE(viable(*g, "bob"));
  EXPECT_FALSE(viable(*g, "Bob 4444"));
  EXPECT_EQ(g->start()->min_bytes_to_accept(), 5);  // "Aa 00"
  auto st = g->start();
  ASSERT_TRUE(st->advance("Bob n"));
  EXPECT_EQ(st->min_bytes_to_accept(), 3);
  EXPECT_THROW(Grammar::regex("(ab"), ValueError);
  EXPECT_THROW(Grammar::regex("(a{1000}){1000}"), ValueError);  // automaton size bound
  EXPECT_THROW(Grammar::regex("(a{1000}){25}"), ValueError);    // 25,000 states: above a regex's 20,000
  EXPECT_NO_THROW(Grammar::regex("a{1000}b{1000}"));
  EXPECT_THROW(Grammar::regex(std::string(1000, '(')), ValueError);  // nesting bound
}

TEST(ConstraintGrammar, ChoicesAcceptAndFinish) {
  auto g = Grammar::choices({"yes", "no", "not sure"});
  EXPECT_TRUE(matches(*g, "no"));
  EXPECT_TRUE(matches(*g, "not sure"));
  EXPECT_FALSE(matches(*g, "not"));
  EXPECT_FALSE(viable(*g, "nope"));
  auto st = g->start();
  EXPECT_EQ(st->min_bytes_to_accept(), 2);
  ASSERT_TRUE(st->advance("no"));
  EXPECT_TRUE(st->accepts());
  EXPECT_TRUE(st->can_continue());  // "not sure" extends it
  ASSERT_TRUE(st->advance("t sure"));
  EXPECT_FALSE(st->can_continue());
  EXPECT_THROW(Grammar::choices({}), ValueError);
}

TEST(ConstraintGrammar, JsonObjectAcceptsRfc8259Objects) {
  auto g = Grammar::json_object();
  for (const std::string ok :
       {"{}", "{\"a\":1}", "{ \"a\" : [1, -2.5e+3, 0, {\"b\": null}], \"c\": \"x\\u00e9\\n\\\"\" }",
        "{\"k\":\"caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80\"}", "{\"s\":\"\\ud83d\\ude00\"}", "{\"t\":true,\"f\":false}",
        "{\n  \"a\": {}\n}", "{\"e\":[]}", "{\"n\":0.5}", "{\"n\":1E9}"}) {
    EXPECT_TRUE(matches(*g, ok)) << ok;
    EXPECT_TRUE(json::parse(ok).is_object()) << ok;
  }
  for (const std::string bad :
       {"[1]", " {}", "{} ", "{\"a\":01}", "{\"a\":1,}", "{'a':1}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00\"}",
        "{\"a\":\"\xff\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\x01\"}", "{\"a\":tru}",
        "{\"a\":1}x", "{\"a\":1 2}", "{\"a\" 1}", "{,}", "{\"a\":-}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":\"\\x\"}"}) {
    EXPECT_FALSE(matches(*g, bad)) << bad;
  }
  // Depth limit 16 (the top-level object is 1), whitespace runs of at most 16 bytes.
  std::string deep = "{\"a\":" + std::string(15, '[') + std::string(15, ']') + "}";
  EXPECT_TRUE(matches(*g, deep));
  EXPECT_FALSE(viable(*g, "{\"a\":" + std::string(16, '[')));
  EXPECT_TRUE(matches(*g, "{" + std::string(16, ' ') + "}"));
  EXPECT_FALSE(viable(*g, "{" + std::string(17, ' ')));
  EXPECT_EQ(g->start()->min_bytes_to_accept(), 2);
  auto st = g->start();
  ASSERT_TRUE(st->advance("{\"a\":[{\"b\":\"x"));
  EXPECT_EQ(st->min_bytes_to_accept(), 4);  // "}]}
}

// Exactness of min_bytes_to_accept on random walks: 0 exactly when accepting, no byte lowers it
// by more than one, and some byte lowers it by exactly one (so it is the shortest completion).
void check_min_bytes(const Grammar& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto st = g.start();
  for (int step = 0; step < 60; ++step) {
    const int64_t m = st->min_bytes_to_accept();
    ASSERT_EQ(m == 0, st->accepts()) << g.describe();
    if (!st->can_continue()) break;
    bool next[256];
    st->next_bytes(next);
    bool drop = m == 0;
    std::vector<int> ok;
    for (int b = 0; b < 256; ++b) {
      auto t = st->clone();
      const char c = static_cast<char>(b);
      const bool alive = t->advance(std::string_view(&c, 1));
      ASSERT_EQ(alive, next[b]) << g.describe() << " byte " << b;
      if (!alive) continue;
      ok.push_back(b);
      ASSERT_GE(t->min_bytes_to_accept(), m - 1) << g.describe();
      if (t->min_bytes_to_accept() == m - 1) drop = true;
    }
    ASSERT_TRUE(drop) << g.describe() << " at step " << step;
    ASSERT_FALSE(ok.empty());
    const char c = static_cast<char>(ok[rng() % ok.size()]);
    ASSERT_TRUE(st->advance(std::string_view(&c, 1)));
  }
}

nlohmann::ordered_json test_schema() {
  return nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer"},
      "score": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
      "ok": {"type": "boolean"},
      "kind": {"enum": ["cat", "dog", 3, null]},
      "nested": {"type": "object", "properties": {"x": {"type": ["integer", "null"]}}, "required": ["x"]},
      "any": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    },
    "required": ["name", "age", "tags"]
  })");
}

TEST(ConstraintGrammar, MinBytesIsTheShortestCompletion) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    check_min_bytes(*Grammar::json_object(), seed);
    check_min_bytes(*Grammar::json_schema(test_schema()), seed);
    check_min_bytes(*Grammar::regex("(ab|c)+[0-9]{2,4}x?"), seed);
    check_min_bytes(*Grammar::choices({"alpha", "alps", "be", "b"}), seed);
  }
}

TEST(ConstraintGrammar, JsonSchemaSubset) {
  auto g = Grammar::json_schema(test_schema());
  EXPECT_TRUE(matches(*g, R"({"name":"Al","age":3,"tags":["a"]})"));
  EXPECT_TRUE(matches(*g, R"({"name": "Al", "age": -3, "score": 1.5e3, "tags": ["a", "c"], "ok": true, "kind": null,)"
                          R"( "nested": {"x": null}, "any": "s"})"));
  EXPECT_FALSE(matches(*g, R"({"age":3,"name":"Al","tags":["a"]})"));         // schema order
  EXPECT_FALSE(matches(*g, R"({"name":"Al","tags":["a"]})"));                 // age required
  EXPECT_FALSE(matches(*g, R"({"name":"Al","age":3.5,"tags":["a"]})"));       // integer
  EXPECT_FALSE(matches(*g, R"({"name":"Al","age":3,"tags":[]})"));            // minItems
  EXPECT_FALSE(matches(*g, R"({"name":"Al","age":3,"tags":["a","a","a","a"]})"));  // maxItems
  EXPECT_FALSE(matches(*g, R"({"name":"Al","age":3,"tags":["d"]})"));         // enum
  EXPECT_FALSE(matches(*g, R"({"name":"123456789","age":3,"tags":["a"]})"));  // maxLength
  EXPECT_FALSE(matches(*g, R"({"name":"Al","age":3,"tags":["a"],"x":1})"));   // no other properties
  EXPECT_FALSE(matches(*g, R"({"name":"Al","age":3,"tags":["a"],"kind":"cow"})"));
  // All properties optional: any in-order subset, commas right.
  auto opt = Grammar::json_schema(json::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"null"},"c":{"type":"boolean"}}})"));
  for (const std::string ok : {"{}", R"({"b":null})", R"({"a":1,"c":true})", R"({"a":1,"b":null,"c":false})"})
    EXPECT_TRUE(matches(*opt, ok)) << ok;
  for (const std::string bad : {R"({,"b":null})", R"({"a":1,})", R"({"c":true,"a":1})"}) EXPECT_FALSE(matches(*opt, bad)) << bad;
  // Ordered schemas keep their written order.
  auto ord = Grammar::json_schema(nlohmann::ordered_json::parse(R"({"properties":{"z":{"const":1},"a":{"const":2}},"required":["z","a"]})"));
  EXPECT_TRUE(matches(*ord, R"({"z":1,"a":2})"));
  EXPECT_FALSE(matches(*ord, R"({"a":2,"z":1})"));
  // Free-form values: any JSON, bounded nesting.
  auto any = Grammar::json_schema(json::parse(R"({"type":"object","properties":{"v":{}},"required":["v"]})"));
  EXPECT_TRUE(matches(*any, R"({"v":{"a":[1,{"b":"c"}]}})"));
  EXPECT_TRUE(matches(*Grammar::json_schema(json::parse(R"({"type":"array","items":{"type":"integer"}})")), "[1, 2,3]"));
}

TEST(ConstraintGrammar, UnsupportedSchemasNameThePathAndKeyword) {
  auto err = [](const std::string& schema) {
    try {
      Grammar::json_schema(json::parse(schema));
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };
  std::string m = err(R"({"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}})");
  EXPECT_TRUE(has(m, "'pattern'") && has(m, "#/properties/a")) << m;
  m = err(R"({"properties":{"a":{"$ref":"#"}}})");
  EXPECT_TRUE(has(m, "'$ref'") && has(m, "#/properties/a")) << m;
  m = err(R"({"oneOf":[{"type":"string"}]})");
  EXPECT_TRUE(has(m, "'oneOf'")) << m;
  m = err(R"({"type":"array","items":{"type":"date"}})");
  EXPECT_TRUE(has(m, "#/items/type")) << m;
  m = err(R"({"type":"object","properties":{"a":{}},"required":["b"]})");
  EXPECT_TRUE(has(m, "#/required") && has(m, "'b'")) << m;
  m = err(R"({"type":"array","maxItems":5000})");
  EXPECT_TRUE(has(m, "#/maxItems")) << m;
  m = err(R"({"type":"array","minItems":3,"maxItems":2})");
  EXPECT_TRUE(has(m, "maxItems below minItems")) << m;
  m = err(R"({"properties":{"a/b":{"format":"date"}}})");
  EXPECT_TRUE(has(m, "#/properties/a~1b") && has(m, "'format'")) << m;
  EXPECT_TRUE(has(err("false"), "matches nothing"));
  EXPECT_TRUE(has(err("3"), "must be an object"));
  EXPECT_TRUE(has(err(R"({"anyOf":[]})"), "#/anyOf"));
  std::string deep = "{\"type\":\"array\",\"items\":";
  for (int i = 0; i < 40; ++i) deep += "{\"type\":\"array\",\"items\":";
  deep += "{}" + std::string(41, '}');
  EXPECT_TRUE(has(err(deep), "nested deeper")) << err(deep);
}

// ---- the vocabulary mask ------------------------------------------------------------------------

// The tokens a brute-force check keeps: each token's bytes fed to a copy of the state.
std::vector<bool> brute_force_allowed(const Grammar& g, const std::string& prefix, const Tokenizer& tok,
                                      const std::vector<TokenId>& eos) {
  auto st = g.start();
  EXPECT_TRUE(st->advance(prefix));
  std::vector<bool> ok(tok.vocab_size(), false);
  for (size_t t = 0; t < tok.vocab_size(); ++t) {
    const TokenId id = static_cast<TokenId>(t);
    if (std::find(eos.begin(), eos.end(), id) != eos.end()) {
      ok[t] = st->accepts();
      continue;
    }
    if (tok.is_special(id) || tok.token_bytes(id).empty()) continue;
    auto c = st->clone();
    ok[t] = c->advance(tok.token_bytes(id));
  }
  return ok;
}

struct Case {
  std::shared_ptr<const Grammar> g;
  std::string check;  // "json", "schema", "regex:<ECMAScript>", "choices"
};

std::vector<Case> cases() {
  return {{Grammar::json_object(), "json"},
          {Grammar::json_schema(test_schema()), "schema"},
          {Grammar::regex("[A-Z][a-z]{1,6} (\\d{2,3}|none)( [a-z]+)?"), "regex:[A-Z][a-z]{1,6} (\\d{2,3}|none)( [a-z]+)?"},
          {Grammar::choices({"yes", "no", "not sure", "n/a"}), "choices"}};
}

TEST_F(ConstraintTest, MaskKeepsExactlyTheLiveTokens) {
  const std::vector<TokenId> eos = {static_cast<TokenId>(tok_->vocab_size() - 1)};
  for (const auto& c : cases()) {
    std::mt19937_64 rng(5);
    TokenConstraint con(c.g, *tok_, eos);
    std::string text;
    for (int step = 0; step < 25 && !con.finished(); ++step) {
      std::vector<float> logits(tok_->vocab_size() + 3, 0.0f);  // a padded model vocabulary
      con.mask(logits, kNoBudget);
      const auto want = brute_force_allowed(*c.g, text, *tok_, eos);
      std::vector<TokenId> live;
      for (size_t t = 0; t < tok_->vocab_size(); ++t) {
        ASSERT_EQ(std::isfinite(logits[t]), want[t]) << c.g->describe() << " token " << t << " after '" << text << "'";
        if (want[t] && std::find(eos.begin(), eos.end(), static_cast<TokenId>(t)) == eos.end())
          live.push_back(static_cast<TokenId>(t));
      }
      for (size_t t = tok_->vocab_size(); t < logits.size(); ++t) EXPECT_FALSE(std::isfinite(logits[t]));
      if (live.empty()) break;
      const TokenId pick = live[rng() % live.size()];
      con.accept(pick);
      text += tok_->token_bytes(pick);
    }
  }
}

// What the output of each case must satisfy, checked by parsers that know nothing of ours.
void validate(const json& v, const nlohmann::ordered_json& s, const std::string& where) {
  if (s.contains("enum")) {
    EXPECT_NE(std::find(s["enum"].begin(), s["enum"].end(), nlohmann::ordered_json(v)), s["enum"].end()) << where;
    return;
  }
  if (s.contains("anyOf")) {
    EXPECT_TRUE(v.is_string() || v.is_number_integer()) << where;
    return;
  }
  const nlohmann::ordered_json types = s["type"].is_array() ? s["type"] : nlohmann::ordered_json::array({s["type"]});
  bool typed = false;
  for (const auto& t : types) {
    const std::string ty = t.get<std::string>();
    if ((ty == "object" && v.is_object()) || (ty == "array" && v.is_array()) || (ty == "string" && v.is_string()) ||
        (ty == "integer" && v.is_number_integer()) || (ty == "number" && v.is_number()) ||
        (ty == "boolean" && v.is_boolean()) || (ty == "null" && v.is_null()))
      typed = true;
  }
  ASSERT_TRUE(typed) << where << ": " << v.dump();
  if (v.is_object()) {
    for (const auto& r : s.value("required", nlohmann::ordered_json::array())) EXPECT_TRUE(v.contains(r.get<std::string>())) << where;
    for (auto it = v.begin(); it != v.end(); ++it) {
      ASSERT_TRUE(s["properties"].contains(it.key())) << where << " has " << it.key();
      validate(it.value(), s["properties"][it.key()], where + "/" + it.key());
    }
  } else if (v.is_array()) {
    EXPECT_GE(v.size(), s.value("minItems", 0u)) << where;
    EXPECT_LE(v.size(), s.value("maxItems", 1000000u)) << where;
    for (const auto& x : v) validate(x, s["items"], where + "[]");
  } else if (v.is_string() && s.contains("maxLength")) {
    size_t code_points = 0;
    for (unsigned char ch : v.get<std::string>()) code_points += (ch & 0xC0) != 0x80;
    EXPECT_LE(code_points, s["maxLength"].get<size_t>()) << where;
  }
}

void check_output(const std::string& check, const std::string& text) {
  if (check == "json") {
    json v;
    ASSERT_NO_THROW(v = json::parse(text)) << text;
    EXPECT_TRUE(v.is_object()) << text;
  } else if (check == "schema") {
    json v;
    ASSERT_NO_THROW(v = json::parse(text)) << text;
    validate(v, test_schema(), "#");
  } else if (check.rfind("regex:", 0) == 0) {
    EXPECT_TRUE(std::regex_match(text, std::regex(check.substr(6)))) << text;
  } else {
    const std::vector<std::string> ch = {"yes", "no", "not sure", "n/a"};
    EXPECT_NE(std::find(ch.begin(), ch.end(), text), ch.end()) << text;
  }
}

// Samples up to `budget` tokens from softmax(random logits) under the mask.
std::string sample_constrained(TokenConstraint& con, const Tokenizer& tok, const std::vector<TokenId>& eos,
                               int64_t budget, uint64_t seed, bool& ended_complete) {
  std::mt19937_64 rng(seed);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::string text;
  ended_complete = false;
  for (int64_t used = 0; used < budget; ++used) {
    if (con.finished()) break;
    std::vector<float> logits(tok.vocab_size());
    for (auto& l : logits) {  // uniform in [0, 12): a flat, noisy "model"
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      l = static_cast<float>(x >> 40) * (12.0f / 16777216.0f);
    }
    con.mask(logits, budget - used);
    float mx = -INFINITY;
    for (float x : logits) mx = std::max(mx, x);
    if (!std::isfinite(mx)) break;
    std::vector<double> p(logits.size());
    for (size_t i = 0; i < p.size(); ++i) p[i] = std::isfinite(logits[i]) ? std::exp(double(logits[i]) - mx) : 0.0;
    const TokenId pick = static_cast<TokenId>(std::discrete_distribution<size_t>(p.begin(), p.end())(rng));
    con.accept(pick);
    if (std::find(eos.begin(), eos.end(), pick) != eos.end()) break;
    text += tok.token_bytes(pick);
  }
  ended_complete = con.complete();
  return text;
}

TEST_F(ConstraintTest, SampledOutputsAlwaysCompleteWithinTheBudget) {
  const std::vector<TokenId> eos = {static_cast<TokenId>(tok_->vocab_size() - 1)};
  int runs = 0;
  for (const auto& c : cases()) {
    const int64_t need = c.g->start()->min_bytes_to_accept();
    for (uint64_t seed = 0; seed < 60; ++seed) {
      // Budgets from barely enough (one token per byte of the shortest completion) upwards.
      const int64_t budget = need + static_cast<int64_t>(seed % 7) * 9;
      TokenConstraint con(c.g, *tok_, eos);
      bool complete = false;
      const std::string text = sample_constrained(con, *tok_, eos, budget, seed * 7919 + 1, complete);
      ASSERT_TRUE(complete) << c.g->describe() << " seed " << seed << " budget " << budget << ": '" << text << "'";
      check_output(c.check, text);
      ++runs;
    }
  }
  EXPECT_EQ(runs, 240);
}

// The same on a real 50k vocabulary (multi-byte tokens such as `"}` or ` {"` cross structure).
TEST(ConstraintGpt2, SampledOutputsAlwaysCompleteWithinTheBudget) {
  const std::string path = std::string(CORELM_SOURCE_DIR) + "/../shared/data/tokenizers/gpt2/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << "needs " << path << " (the shared data folder)";
  auto tok = Tokenizer::load(path);
  ASSERT_TRUE(tok->eos_id().has_value());
  const std::vector<TokenId> eos = {*tok->eos_id()};
  for (const auto& c : cases()) {
    const int64_t need = c.g->start()->min_bytes_to_accept();
    for (uint64_t seed = 0; seed < 8; ++seed) {
      const int64_t budget = need + static_cast<int64_t>(seed % 4) * 12;
      TokenConstraint con(c.g, *tok, {});
      bool complete = false;
      const std::string text = sample_constrained(con, *tok, eos, budget, seed + 11, complete);
      ASSERT_TRUE(complete) << c.g->describe() << " seed " << seed << " budget " << budget << ": '" << text << "'";
      check_output(c.check, text);
    }
  }
}

TEST_F(ConstraintTest, CloneIsIndependent) {
  TokenConstraint a(Grammar::choices({"yes", "no"}), *tok_, {});
  const auto y = tok_->token_to_id("y"), n = tok_->token_to_id("n");
  ASSERT_TRUE(y && n);
  TokenConstraint b = a.clone();
  a.accept(*y);
  std::vector<float> la(tok_->vocab_size(), 0.0f), lb(tok_->vocab_size(), 0.0f);
  a.mask(la, kNoBudget);
  b.mask(lb, kNoBudget);
  EXPECT_FALSE(std::isfinite(la[*n]));
  EXPECT_TRUE(std::isfinite(lb[*n]));
  b.accept(*n);
  EXPECT_THROW(a.accept(*n), ValueError);  // "yn" is no choice
}

TEST_F(ConstraintTest, AcceptRejectsWhatMaskRemoves) {
  const TokenId eos = static_cast<TokenId>(tok_->vocab_size() - 1);
  TokenConstraint con(Grammar::json_object(), *tok_, {eos});
  const auto x = tok_->token_to_id("x"), brace = tok_->token_to_id("{");
  ASSERT_TRUE(x && brace);
  EXPECT_THROW(con.accept(*x), ValueError);
  EXPECT_THROW(con.accept(eos), ValueError);  // not complete yet
  EXPECT_THROW(con.accept(-1), ValueError);
  con.accept(*brace);
  EXPECT_FALSE(con.complete());
}

TEST_F(ConstraintTest, ForcingClosesTheObjectAtTheBudget) {
  // With a budget of exactly the shortest completion, every token must shorten it.
  TokenConstraint con(Grammar::json_object(), *tok_, {});
  const auto brace = tok_->token_to_id("{"), quote = tok_->token_to_id("\"");
  ASSERT_TRUE(brace && quote);
  con.accept(*brace);
  con.accept(*quote);  // {"  needs ":0} (4 bytes)
  std::vector<float> logits(tok_->vocab_size(), 0.0f);
  con.mask(logits, 4);
  for (size_t t = 0; t < logits.size(); ++t) {
    if (!std::isfinite(logits[t])) continue;
    auto st = Grammar::json_object()->start();
    ASSERT_TRUE(st->advance("{\"") && st->advance(tok_->token_bytes(static_cast<TokenId>(t))));
    EXPECT_LT(st->min_bytes_to_accept(), 4) << "token '" << tok_->token_bytes(static_cast<TokenId>(t)) << "'";
  }
}

TEST_F(ConstraintTest, BudgetBelowTheShortestCompletionIsBestEffort) {
  // The schema's smallest instance is far longer than 2 tokens: nothing can fit, so mask() keeps
  // the tokens that get closest rather than none, and the output ends incomplete.
  TokenConstraint con(Grammar::json_schema(test_schema()), *tok_, {});
  std::vector<float> logits(tok_->vocab_size(), 0.0f);
  con.mask(logits, 2);
  EXPECT_GT(std::count_if(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }), 0);
  bool complete = true;
  sample_constrained(con, *tok_, {}, 2, 3, complete);
  EXPECT_FALSE(complete);
}

TEST_F(ConstraintTest, ConstraintsFromManyThreadsAgree) {
  std::vector<std::vector<float>> out(4);
  std::vector<std::thread> th;
  for (int i = 0; i < 4; ++i)
    th.emplace_back([&, i] {
      TokenConstraint con(Grammar::json_schema(test_schema()), *tok_, {});
      out[i].assign(tok_->vocab_size(), 0.0f);
      con.mask(out[i], kNoBudget);
    });
  for (auto& t : th) t.join();
  for (int i = 1; i < 4; ++i) EXPECT_EQ(out[i], out[0]);
}

// CPU time of this thread (the machine is shared: wall time would count other people's work).
double thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

// Not a test: mask() cost per step, printed (run with --gtest_also_run_disabled_tests). Uses the
// GPT-2 tokenizer from the shared data when present, else the test tokenizer.
TEST_F(ConstraintTest, DISABLED_MaskCost) {
  std::string many = R"({"type":"object","properties":{)";
  for (int i = 0; i < 24; ++i) many += (i ? ",\"p" : "\"p") + std::to_string(i) + R"(":{"type":"string"})";
  many += "}}";
  for (const std::string& schema : {std::string(test_schema().dump()), std::string("{}"), std::string(R"({"type":"object"})"), many}) {
    const double t0 = thread_cpu_us();
    try {
      Grammar::json_schema(nlohmann::ordered_json::parse(schema));
    } catch (const ValueError& e) {
      std::printf("%s\n", e.what());
    }
    std::printf("{\"compile_us\": %.0f, \"schema\": %s}\n", thread_cpu_us() - t0, schema.substr(0, 40).c_str());
  }
  std::unique_ptr<Tokenizer> gpt2;
  const std::string path = std::string(CORELM_SOURCE_DIR) + "/../shared/data/tokenizers/gpt2/tokenizer.json";
  if (fs::exists(path)) gpt2 = Tokenizer::load(path);
  for (const Tokenizer* tok : {static_cast<const Tokenizer*>(tok_), static_cast<const Tokenizer*>(gpt2.get())}) {
    if (!tok) continue;
    for (const auto& c : cases()) {
      double first = 0, total = 0;
      int steps = 0;
      for (uint64_t seed = 0; seed < 5; ++seed) {
        TokenConstraint con(c.g, *tok, {});
        uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
        for (int64_t used = 0; used < 48 && !con.finished(); ++used) {
          std::vector<float> logits(tok->vocab_size());
          for (auto& l : logits) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            l = static_cast<float>(x >> 40) * 1e-6f;
          }
          const double t0 = thread_cpu_us();
          con.mask(logits, 48 - used);
          const double us = thread_cpu_us() - t0;
          if (used == 0 && seed == 0) first = us;
          total += us;
          ++steps;
          size_t best = 0;
          for (size_t i = 0; i < logits.size(); ++i)
            if (logits[i] > logits[best]) best = i;
          if (!std::isfinite(logits[best])) break;
          con.accept(static_cast<TokenId>(best));
        }
      }
      std::printf("{\"vocab\": %zu, \"grammar\": \"%s\", \"first_mask_us\": %.0f, \"mean_mask_us\": %.1f, \"steps\": %d}\n",
                  tok->vocab_size(), c.g->describe().substr(0, 24).c_str(), first, total / steps, steps);
    }
  }
}

}  // namespace
}  // namespace corelm::infer
