// corelm's ChatTemplate against Python's jinja2 configured as transformers configures it
// (tests/oracle/chat_template_oracle.py), on the real chat templates of
// tests/data/chat_templates (Llama-3.1/3.2, Qwen2.5 with its tools branch, SmolLM2, Mistral,
// Gemma 2) over conversations covering system/user/assistant mixes, multi-turn, generation
// prompt on/off, unicode, quotes and newlines, tools and tool calls, and the messages that make
// a template raise (non-alternating roles, a system role where none is allowed, no messages).
// The outputs must be equal byte for byte; where jinja2 raises, ours must raise too, and for the
// template's own raise_exception with the template's message.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "corelm/chat_template.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const Fixture& fixture() { return load_fixture("chat_template_oracle.py", "chat_templates.json"); }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Renders one case; "" + the message in `error` when ours raises.
std::string ours(const std::string& source, const ojson& context, std::string& error) {
  try {
    return infer::ChatTemplate(source).render(context);
  } catch (const infer::TemplateError& e) {
    error = e.what();
  }
  return "";
}

TEST(ChatTemplateOracle, RealTemplatesRenderLikeJinja2) {
  const Fixture& fx = fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  // Read again with the key order kept (load_fixture's json sorts keys): `tools | tojson` prints
  // keys in the order the request gave them.
  const ojson data = ojson::parse(read_text(fs::path(CORELM_BINARY_DIR) / "oracle" / "chat_templates.json"));
  const fs::path dir = fs::path(CORELM_SOURCE_DIR) / "tests" / "data" / "chat_templates";
  std::map<std::string, int> checked, raised;
  for (const auto& c : data.at("cases")) {
    const std::string name = c.at("template").get<std::string>();
    if (name.front() == '<' || name.starts_with("shared/")) continue;  // their own tests below
    const std::string source = read_text(dir / name);
    ASSERT_EQ(source, c.at("source").get<std::string>())
        << name << " changed since the fixture was made: delete " << CORELM_BINARY_DIR << "/oracle/chat_templates.json";
    const std::string where = name + " / " + c.at("conversation").get<std::string>();
    std::string error;
    const std::string got = ours(source, c.at("context"), error);
    if (c.contains("output")) {
      EXPECT_EQ(error, "") << where;
      EXPECT_EQ(got, c.at("output").get<std::string>()) << where;
    } else {
      EXPECT_NE(error, "") << where << ": jinja2 raised " << c.at("error") << " (" << c.at("message")
                           << "), ours rendered:\n" << got;
      const std::string msg = c.at("message").get<std::string>();
      if (c.at("error") == "raise_exception" || c.at("error") == "UndefinedError") {
        EXPECT_TRUE(error.ends_with(msg)) << where << ": ours: " << error << "\njinja2: " << msg;
      }
      ++raised[name];
    }
    ++checked[name];
  }
  // Every template took part, and the cases that must raise did.
  for (const char* t : {"meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
                        "Qwen-Qwen2.5-7B-Instruct.jinja", "HuggingFaceTB-SmolLM2-Instruct.jinja",
                        "mistralai-Mistral-7B-Instruct-v0.2.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                        "google-gemma-2-2b-it.jinja"})
    EXPECT_GE(checked[t], 15) << t;
  EXPECT_GE(raised["google-gemma-2-2b-it.jinja"], 3);
  EXPECT_GE(raised["mistralai-Mistral-7B-Instruct-v0.2.jinja"], 3);
}

TEST(ChatTemplateOracle, ConstructSnippetsRenderLikeJinja2) {
  const Fixture& fx = fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  const ojson data = ojson::parse(read_text(fs::path(CORELM_BINARY_DIR) / "oracle" / "chat_templates.json"));
  int n = 0;
  for (const auto& c : data.at("cases")) {
    if (c.at("template") != "<snippet>") continue;
    ++n;
    const std::string source = c.at("source").get<std::string>();
    std::string error;
    const std::string got = ours(source, c.at("context"), error);
    if (c.contains("output")) {
      EXPECT_EQ(error, "") << source;
      EXPECT_EQ(got, c.at("output").get<std::string>()) << source;
    } else {
      EXPECT_NE(error, "") << source << ": jinja2 raised " << c.at("error") << " (" << c.at("message") << "), ours rendered "
                           << got;
      if (c.at("error") == "raise_exception") {
        EXPECT_TRUE(error.ends_with(c.at("message").get<std::string>())) << error;
      }
    }
  }
  EXPECT_GE(n, 40);
}

// The templates of the shared data's tokenizer_config.json files (Llama 3, Qwen3 with its
// reasoning-content handling), when the shared data is there.
TEST(ChatTemplateOracle, SharedDataTemplatesRenderLikeJinja2) {
  const Fixture& fx = fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  const ojson data = ojson::parse(read_text(fs::path(CORELM_BINARY_DIR) / "oracle" / "chat_templates.json"));
  int n = 0;
  for (const auto& c : data.at("cases")) {
    const std::string name = c.at("template").get<std::string>();
    if (!name.starts_with("shared/")) continue;
    ++n;
    const std::string where = name + " / " + c.at("conversation").get<std::string>();
    std::string error;
    const std::string got = ours(c.at("source").get<std::string>(), c.at("context"), error);
    if (c.contains("output")) {
      EXPECT_EQ(error, "") << where;
      EXPECT_EQ(got, c.at("output").get<std::string>()) << where;
    } else {
      EXPECT_NE(error, "") << where << ": jinja2 raised " << c.at("message");
    }
  }
  if (n == 0) GTEST_SKIP() << "no ../shared/data/tokenizers/*/tokenizer_config.json (shared data absent)";
}

TEST(ChatTemplateOracle, QwenToolsBranchIsExercised) {
  const Fixture& fx = fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  bool tools = false, tool_call = false;
  for (const auto& c : fx.data->at("cases")) {
    if (c.at("template") != "Qwen-Qwen2.5-7B-Instruct.jinja" || !c.contains("output")) continue;
    const std::string out = c.at("output").get<std::string>();
    tools = tools || out.find("<tools>\n{\"type\": \"function\"") != std::string::npos;
    tool_call = tool_call || (out.find("<tool_call>") != std::string::npos && out.find("<tool_response>") != std::string::npos);
  }
  EXPECT_TRUE(tools);
  EXPECT_TRUE(tool_call);
}

TEST(ChatTemplateOracle, StrftimeNowMatchesPython) {
  const Fixture& fx = fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  for (const auto& c : fx.data->at("cases")) {
    if (c.at("template") != "<strftime_now>") continue;
    std::string error;
    const std::string got = ours(c.at("source").get<std::string>(), ojson::object(), error);
    EXPECT_EQ(error, "");
    // The fixture may be older than today: compare the format, then today's date via strftime.
    char today[64];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    std::strftime(today, sizeof today, "%d %b %Y", &tm);
    EXPECT_EQ(got, today);
    EXPECT_EQ(got.size(), c.at("output").get<std::string>().size());
    return;
  }
  FAIL() << "no strftime_now case in the fixture";
}

}  // namespace
}  // namespace corelm::oracle
