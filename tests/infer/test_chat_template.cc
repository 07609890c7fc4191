// ChatTemplate unit tests: each construct of the subset, whitespace control as transformers
// configures jinja2 (trim_blocks, lstrip_blocks), errors naming line:column and the construct,
// limits, and the default template. The byte-for-byte comparison with Python's jinja2 on real
// model templates is tests/oracle/test_chat_template_oracle.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "corelm/chat_template.h"

namespace corelm::infer {
namespace {

using nlohmann::json;

std::string R(const std::string& src, const json& ctx = json::object()) { return ChatTemplate(src).render(ctx); }
std::string RO(const std::string& src, const nlohmann::ordered_json& ctx) { return ChatTemplate(src).render(ctx); }

// The message of the TemplateError `src` raises (parsing or rendering), or "" when none.
std::string error_of(const std::string& src, const json& ctx = json::object()) {
  try {
    R(src, ctx);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, TextAndVariables) {
  EXPECT_EQ(R("hello"), "hello");
  EXPECT_EQ(R("a{{ x }}b", {{"x", "X"}}), "aXb");
  EXPECT_EQ(R("{{ n }} {{ f }} {{ t }} {{ z }}", {{"n", 3}, {"f", 1.0}, {"t", true}, {"z", nullptr}}), "3 1.0 True None");
  EXPECT_EQ(R("{{ [1, 'a', none, true] }}"), "[1, 'a', None, True]");
  EXPECT_EQ(R("{{ {'a': 1, 'b': \"it's\"} }}"), "{'a': 1, 'b': \"it's\"}");
  EXPECT_EQ(R("{{ 0.1 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 100.0 }} {{ 2.5e15 }}"), "0.1 1e+20 1.5e-07 100.0 2500000000000000.0");
  EXPECT_EQ(R("{{ 'a' 'b' }}"), "ab");
  EXPECT_EQ(R("{{ '\\n\\t\\u00e9\\x41' }}"), "\n\t\xc3\xa9" "A");
  // One trailing newline of the source is dropped; \r\n reads as \n.
  EXPECT_EQ(R("a\n"), "a");
  EXPECT_EQ(R("a\n\n"), "a\n");
  EXPECT_EQ(R("a\r\nb"), "a\nb");
}

TEST(ChatTemplate, UndefinedBehavesLikeJinja2Default) {
  EXPECT_EQ(R("[{{ nope }}]"), "[]");
  EXPECT_EQ(R("{% if nope %}y{% else %}n{% endif %}"), "n");
  EXPECT_EQ(R("{{ nope is defined }} {{ nope is undefined }}"), "False True");
  EXPECT_EQ(R("{{ d.missing }}|{{ d['missing'] }}|{{ d.missing is defined }}", {{"d", json::object()}}), "||False");
  EXPECT_EQ(R("{{ nope | default('x') }} {{ '' | default('y', true) }}"), "x y");
  EXPECT_EQ(R("{{ nope | length }}{% for x in nope %}x{% endfor %}"), "0");
  EXPECT_EQ(R("{{ nope ~ 'a' }}"), "a");
  // Using it any other way is jinja2's UndefinedError.
  EXPECT_NE(error_of("{{ nope.attr }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nope + 1 }}").find("'nope' is undefined"), std::string::npos);
}

TEST(ChatTemplate, Operators) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"),
            "7 9 3 -4 1 2 3.5 1024");
  EXPECT_EQ(R("{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none }} {{ [1] + [2] }} {{ 'ab' * 2 }}"), "ab a1None [1, 2] abab");
  EXPECT_EQ(R("{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 2 >= 3 }} {{ true == 1 }}"), "True True True False True");
  EXPECT_EQ(R("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}"), "True True True True");
  EXPECT_EQ(R("{{ 1 and 'x' }} {{ 0 or 'y' }} {{ not 0 }} {{ none or [] }}"), "x y True []");
  EXPECT_EQ(R("{{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }}", {{"x", 0}}), "n y");
  EXPECT_EQ(R("[{{ 'y' if false }}]"), "[]");
  EXPECT_EQ(R("{{ -x }} {{ +x }}", {{"x", 2}}), "-2 2");
}

TEST(ChatTemplate, AccessAndSlicing) {
  const json ctx = {{"m", {{"role", "user"}, {"content", "héllo"}}}, {"l", {1, 2, 3, 4, 5}}};
  EXPECT_EQ(R("{{ m.role }} {{ m['content'] }} {{ l[0] }} {{ l[-1] }} {{ l.1 }}", ctx), "user héllo 1 5 2");
  EXPECT_EQ(R("{{ l[1:3] }} {{ l[:2] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }}", ctx),
            "[2, 3] [1, 2] [5, 4, 3, 2, 1] [1, 3, 5] [4, 5]");
  EXPECT_EQ(R("{{ m.content[1:3] }} {{ m.content[::-1] }} {{ m.content | length }}", ctx), "él olléh 5");
  EXPECT_EQ(R("{{ l[10] is defined }}", ctx), "False");
}

TEST(ChatTemplate, ForLoops) {
  const json ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}{% if loop.first %}F{% endif %}"
              "{% if loop.last %}L{% endif %}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }},{% endfor %}",
              ctx),
            "10aF332,21b321,32cL310,");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in xs if x != 'b' %}{{ x }}{{ loop.length }}{% endfor %}", ctx), "a2c2");
  EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(R("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}"), "ab");
  EXPECT_EQ(R("{% for x in xs %}{{ loop.cycle('o', 'e') }}{% endfor %}", ctx), "oeo");
  EXPECT_EQ(R("{% for x in xs %}{{ loop.previtem }}{{ x }}{{ loop.nextitem }},{% endfor %}", ctx), "ab,abc,bc,");
  EXPECT_EQ(R("{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}"), "012135");
  EXPECT_EQ(R("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", ctx), "a");
  EXPECT_EQ(R("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% endfor %}", ctx), "ac");
  // A loop's set does not leak out (why templates use namespace()).
  EXPECT_EQ(R("{% set y = 1 %}{% for x in xs %}{% set y = 2 %}{% endfor %}{{ y }}", ctx), "1");
}

TEST(ChatTemplate, IfSetNamespace) {
  EXPECT_EQ(R("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {{"a", false}, {"b", true}}), "B");
  EXPECT_EQ(R("{% set x = 'v' %}{{ x }}{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "v12");
  EXPECT_EQ(R("{% set ns = namespace(found=false, n=0) %}{% for i in range(3) %}{% set ns.found = true %}"
              "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.found }} {{ ns.n }}"),
            "True 3");
  EXPECT_EQ(R("{% set block %}in{{ 1 }}{% endset %}[{{ block }}]"), "[in1]");
  EXPECT_EQ(R("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(ChatTemplate, Filters) {
  EXPECT_EQ(R("{{ '  a b \n' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}"), "a b|a|ABab");
  EXPECT_EQ(R("{{ [1, 2] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }}"), "2 5 1");
  EXPECT_EQ(R("{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ [1, 2] | join(', ') }} {{ 'abc' | list }}"),
            "1 3 1, 2 ['a', 'b', 'c']");
  EXPECT_EQ(R("{{ 'aXbX' | replace('X', '-') }} {{ 3 | string }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }}"),
            "a-b- 3 43 0 2.5");
  EXPECT_EQ(R("{% for k, v in {'a': 1} | items %}{{ k }}{{ v }}{% endfor %}"), "a1");
  EXPECT_EQ(R("{{ 'hello world' | title }} {{ 'hELLO' | capitalize }} {{ -3 | abs }} {{ [3, 1, 2] | sort }}"),
            "Hello World Hello 3 [1, 2, 3]");
  EXPECT_EQ(R("{{ [{'a': 1}, {'a': 2}] | map(attribute='a') | list }} {{ [1, 2, 3] | select('odd') | list }}"),
            "[1, 2] [1, 3]");
  EXPECT_EQ(R("{{ xs | selectattr('role', 'equalto', 'user') | map(attribute='c') | join }}",
              {{"xs", {{{"role", "user"}, {"c", "u1"}}, {{"role", "sys"}, {"c", "s"}}, {{"role", "user"}, {"c", "u2"}}}}}),
            "u1u2");
  EXPECT_EQ(R("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
}

TEST(ChatTemplate, ToJsonMatchesTransformers) {
  // json.dumps(x, ensure_ascii=False): ", " / ": " separators, keys in insertion order, UTF-8 kept.
  const auto ctx = nlohmann::ordered_json::parse(R"({"t": {"name": "f", "d": "é\"\n<&>", "n": [1, 2.5, true, null], "e": {}}})");
  EXPECT_EQ(RO("{{ t | tojson }}", ctx), R"({"name": "f", "d": "é\"\n<&>", "n": [1, 2.5, true, null], "e": {}})");
  EXPECT_EQ(RO("{{ t.n | tojson(indent=2) }}", ctx), "[\n  1,\n  2.5,\n  true,\n  null\n]");
  EXPECT_EQ(RO("{{ t.d | tojson(ensure_ascii=true) }}", ctx), R"("\u00e9\"\n<&>")");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), R"({"a": 2, "b": 1})");
  EXPECT_EQ(R("{{ [1, 2] | tojson(separators=(',', ':')) }}"), "[1,2]");
}

TEST(ChatTemplate, Tests) {
  EXPECT_EQ(R("{{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.5 is float }}"
              " {{ {} is mapping }} {{ [] is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }}"
              " {{ 1 is not none }} {{ true is boolean }} {{ 'a' is eq 'a' }}"),
            "True True True True True True True True True True True True True");
}

TEST(ChatTemplate, StringAndDictMethods) {
  EXPECT_EQ(R("{{ ' a '.strip() }}|{{ 'xax'.strip('x') }}|{{ 'a,b'.split(',') }}|{{ ' a  b '.split() }}"),
            "a|a|['a', 'b']|['a', 'b']");
  EXPECT_EQ(R("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'ab'.upper() }} {{ 'a-b'.replace('-', '+') }}"),
            "True True AB a+b");
  EXPECT_EQ(R("{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list }}",
              {{"d", {{"a", 1}}}}),
            "1 dflt None ['a'] [1]");
}

TEST(ChatTemplate, WhitespaceControlAsTransformersConfiguresJinja) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it goes.
  EXPECT_EQ(R("{% if true %}\n  x\n{% endif %}\ny"), "  x\ny");
  EXPECT_EQ(R("a\n    {% if true %}\nb\n    {% endif %}\nc"), "a\nb\nc");
  // Not for {{ }}; `-` strips every whitespace on its side; `+` keeps the indentation.
  EXPECT_EQ(R("a\n  {{ 'v' }}\nb"), "a\n  v\nb");
  EXPECT_EQ(R("a  \n  {{- 'v' -}}  \n  b"), "avb");
  EXPECT_EQ(R("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(R("x {# comment #}\ny\n  {# c2 #}\nz"), "x y\nz");
  EXPECT_EQ(R("{%- if true -%}  \n a \n {%- endif -%}\n"), "a");
}

TEST(ChatTemplate, RaiseExceptionCarriesTheTemplatesMessage) {
  const std::string e = error_of("line one\n{{ raise_exception('Roles must alternate') }}");
  EXPECT_NE(e.find("Roles must alternate"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2:4"), std::string::npos) << e;
}

TEST(ChatTemplate, UnsupportedConstructsNameTheConstructAndPosition) {
  struct Case {
    std::string src, construct, pos;
  } cases[] = {
      {"ok\n{% macro m() %}x{% endmacro %}", "macro", "line 2:1"},
      {"{{ x | wordwrap }}", "filter 'wordwrap'", "line 1:8"},
      {"{{ x is escaped }}", "test 'escaped'", "line 1:6"},
      {"{% include 'f' %}", "include", "line 1:1"},
      {"{% raw %}x{% endraw %}", "raw", "line 1:1"},
      {"{% for x in xs recursive %}{% endfor %}", "recursive", "line 1:16"},
      {"a\n  {% if x %}", "missing '{% endif %}'", "line 2:"},
      {"{% endfor %}", "unexpected '{% endfor %}'", "line 1:1"},
      {"{{ x ", "missing '}}'", "line 1:1"},
      {"{{ 'abc }}", "unterminated string", "line 1:4"},
      {"{% break %}", "outside of a loop", "line 1:1"},
      {"{{ (1 + }}", "unexpected", "line 1:"},
  };
  for (const auto& c : cases) {
    std::string msg;
    try {
      ChatTemplate t(c.src);
    } catch (const TemplateError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.construct), std::string::npos) << c.src << " -> " << msg;
    EXPECT_NE(msg.find(c.pos), std::string::npos) << c.src << " -> " << msg;
  }
  // Render-time failures name the position too.
  const std::string e = error_of("\n  {{ 1 + 'a' }}");
  EXPECT_NE(e.find("line 2:8"), std::string::npos) << e;
  EXPECT_NE(e.find("unsupported operand"), std::string::npos) << e;
  EXPECT_NE(error_of("{{ foo() }}").find("'foo' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{% set x.y = 1 %}", {{"x", 1}}).find("namespace"), std::string::npos);
}

TEST(ChatTemplate, LimitsStopHostileTemplates) {
  std::string deep(200, '(');
  EXPECT_NE(error_of("{{ " + deep + "1" + std::string(200, ')') + " }}").find("nested too deeply"), std::string::npos);
  std::string chain = "{{ 1";
  for (int k = 0; k < 5000; ++k) chain += "+1";
  EXPECT_NE(error_of(chain + " }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000000) %}{% endfor %}").find("range()"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").find("too expensive"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000000 }}").find("limit"), std::string::npos);
  EXPECT_NE(error_of("{% set s = namespace(v='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}")
                .find("larger than"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  // Values cannot nest without bound, nor a namespace hold itself (a reference cycle).
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}")
                .find("nested deeper"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}").find("namespace"), std::string::npos);
  json nested = 1;
  for (int k = 0; k < 300; ++k) nested = json::array({nested});
  EXPECT_NE(error_of("{{ d }}", {{"d", nested}}).find("deeper"), std::string::npos);
}

TEST(ChatTemplate, DefaultTemplateIsChatML) {
  const ChatTemplate t(ChatTemplate::default_source());
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "?"}};
  EXPECT_EQ(t.apply(msgs, true, "", ""),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
            "<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.apply({{"user", "Hi"}}, false, "", ""), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(t.source(), ChatTemplate::default_source());
}

// Without Python: every real template of the test data parses and renders a plain exchange with
// the user's text in it (the byte-for-byte check against jinja2 is the oracle test).
TEST(ChatTemplate, RealTemplatesOfTheTestDataRender) {
  const std::filesystem::path dir = std::filesystem::path(CORELM_SOURCE_DIR) / "tests/data/chat_templates";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".jinja") continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const ChatTemplate t(ss.str());
    const std::string out = t.apply({{"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "Thanks!"}}, true, "<s>", "</s>");
    EXPECT_NE(out.find("What is 2+2?"), std::string::npos) << e.path();
    EXPECT_NE(out.find("Thanks!"), std::string::npos) << e.path();
    ++n;
  }
  EXPECT_GE(n, 7);
}

TEST(ChatTemplate, ApplyPassesSpecialTokensAndIsReusable) {
  const ChatTemplate t("{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                       "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ tools is none }}");
  EXPECT_EQ(t.apply({{"user", "a"}}, true, "<s>", "</s>"), "<s>[user:a]></s>True");
  ChatTemplate moved = std::move(const_cast<ChatTemplate&>(t));
  EXPECT_EQ(moved.apply({{"user", "b"}}, false, "", ""), "[user:b]True");
  EXPECT_THROW(moved.render(json::array()), TemplateError);
}

}  // namespace
}  // namespace corelm::infer
