// The chat template travels with the model: load_model reads it (tokenizer_config.json
// `chat_template` as a string or a list of named templates, a chat_template.jinja file, GGUF
// `tokenizer.chat_template`) together with the bos/eos texts it sees, and save_model writes it
// wherever the target can hold it (GGUF metadata, tokenizer_config.json), so folder -> GGUF ->
// folder keeps it byte for byte. Malformed fields are FormatErrors naming the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/tensor_factories.h"
#include "corelm/architecture.h"
#include "corelm/chat_template.h"
#include "corelm/error.h"
#include "corelm/gguf.h"
#include "corelm/model_loader.h"
#include "corelm/tokenizer_train.h"

namespace corelm {
namespace {

namespace fs = std::filesystem;
using model::Checkpoint;
using nlohmann::json;

struct Scratch {
  fs::path path = fs::temp_directory_path() / ("corelm_chat_tpl_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Scratch() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A real template from the test data (SmolLM2's ChatML with a default system prompt).
std::string smollm2_template() {
  return read_text((fs::path(CORELM_SOURCE_DIR) / "tests/data/chat_templates/HuggingFaceTB-SmolLM2-Instruct.jinja").string());
}

// A tiny llama folder with a BPE tokenizer trained here and the given tokenizer_config.json.
std::string model_folder(const Scratch& s, const json& tokenizer_config) {
  const json config = {{"model_type", "llama"},      {"vocab_size", 320},   {"hidden_size", 32},
                       {"intermediate_size", 48},    {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                       {"num_key_value_heads", 1},   {"max_position_embeddings", 32}, {"tie_word_embeddings", true}};
  model::Decoder d(model::ModelConfig::from_json(config));
  uint64_t seed = 3;
  for (const auto& [name, p] : d.named_parameters()) d.load_parameter(name, testing::random_tensor(p.shape(), seed++, 0.05f));
  const std::string dir = s / "hf";
  model::save_model(Checkpoint{model::LoadedModel{std::move(d), nullptr}, "model-dir", {}, -1, {}, {}, {}, {}, {}}, dir,
                    {"hf", "f32", 0, {}});
  std::string text;
  for (int i = 0; i < 100; ++i) text += "Hello there, assistant number " + std::to_string(i) + "! <s> </s>\n";
  write_text(s / "corpus.txt", text);
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.special_tokens = {"<|im_start|>", "<|im_end|>", "<s>", "</s>"};
  train_bpe({s / "corpus.txt"}, o, dir + "/tokenizer.json");
  if (!tokenizer_config.is_null()) write_text(dir + "/tokenizer_config.json", tokenizer_config.dump(2));
  return dir;
}

TEST(ChatTemplateLoad, FromTokenizerConfigWithAddedTokenObjects) {
  Scratch s;
  const std::string dir = model_folder(s, {{"chat_template", smollm2_template()},
                                           {"bos_token", {{"__type", "AddedToken"}, {"content", "<|im_start|>"}}},
                                           {"eos_token", "<|im_end|>"}});
  const Checkpoint ck = model::load_model(dir);
  EXPECT_EQ(ck.chat_template, smollm2_template());
  EXPECT_EQ(ck.bos_token, "<|im_start|>");
  EXPECT_EQ(ck.eos_token, "<|im_end|>");
  // ... and it renders.
  const infer::ChatTemplate t(ck.chat_template);
  EXPECT_EQ(t.apply({{"user", "Hi"}}, true, ck.bos_token, ck.eos_token),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateLoad, ListOfNamedTemplatesTakesDefault) {
  Scratch s;
  const json list = json::array({{{"name", "tool_use"}, {"template", "TOOLS"}}, {{"name", "default"}, {"template", "DEFAULT"}}});
  EXPECT_EQ(model::load_model(model_folder(s, {{"chat_template", list}})).chat_template, "DEFAULT");
}

TEST(ChatTemplateLoad, ListWithoutDefaultTakesTheFirstAndWarns) {
  Scratch s;
  const json list = json::array({{{"name", "rag"}, {"template", "RAG"}}, {{"name", "tool_use"}, {"template", "TOOLS"}}});
  const Checkpoint ck = model::load_model(model_folder(s, {{"chat_template", list}}));
  EXPECT_EQ(ck.chat_template, "RAG");
  bool warned = false;
  for (const auto& w : ck.warnings) warned = warned || w.find("no \"default\"") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST(ChatTemplateLoad, ChatTemplateJinjaFileTakesPrecedence) {
  Scratch s;
  const std::string dir = model_folder(s, {{"chat_template", "FROM CONFIG"}});
  write_text(dir + "/chat_template.jinja", "FROM FILE {{ messages | length }}");
  EXPECT_EQ(model::load_model(dir).chat_template, "FROM FILE {{ messages | length }}");
}

// bos/eos texts fall back to the tokenizer's special ids only when tokenizer_config.json does not
// name them; a null there (Qwen's "bos_token": null) means none.
TEST(ChatTemplateLoad, SpecialTokenTextsFallBackToTheTokenizerIds) {
  Scratch s;
  const std::string dir = model_folder(s, {{"bos_token", nullptr}});
  const Checkpoint named_null = model::load_model(dir);
  EXPECT_EQ(named_null.bos_token, "");
  // Through GGUF the texts come from tokenizer.ggml.bos/eos_token_id.
  model::save_model(named_null, s / "m.gguf", {});
  const Checkpoint gguf = model::load_model(s / "m.gguf");
  ASSERT_NE(gguf.model.tokenizer, nullptr);
  const auto eos = gguf.model.tokenizer->eos_id();
  EXPECT_EQ(gguf.eos_token, eos ? std::string(gguf.model.tokenizer->token_bytes(*eos)) : std::string());
}

TEST(ChatTemplateLoad, NoTemplateIsEmpty) {
  Scratch s;
  const Checkpoint ck = model::load_model(model_folder(s, nullptr));
  EXPECT_EQ(ck.chat_template, "");
}

TEST(ChatTemplateLoad, MalformedFieldsAreFormatErrorsNamingTheField) {
  for (const json& bad : {json{{"chat_template", 5}}, json{{"chat_template", json::array({"just a string"})}},
                          json{{"chat_template", json::array({{{"name", "default"}}})}}}) {
    Scratch s;
    const std::string dir = model_folder(s, bad);
    try {
      model::load_model(dir);
      ADD_FAILURE() << "no error for " << bad.dump();
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("chat_template"), std::string::npos) << e.what();
    }
  }
}

TEST(ChatTemplateLoad, GgufTemplateOfTheWrongTypeIsAFormatError) {
  Scratch s;
  const Checkpoint hf = model::load_model(model_folder(s, nullptr));
  model::save_gguf_model(s / "bad.gguf", hf.model.decoder.config().to_json(), hf.model.decoder.named_parameters(),
                      io::GGMLType::F32, {{"tokenizer.chat_template", io::GGUFValue::of(io::GGUFType::Uint32, 7)}});
  try {
    model::load_model(s / "bad.gguf", {true, "", "f32", false});
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template"), std::string::npos) << e.what();
  }
}

// folder -> GGUF (tokenizer.chat_template) -> folder (tokenizer_config.json) -> the same template.
TEST(ChatTemplateRoundTrip, FolderToGgufToFolderKeepsTheTemplate) {
  Scratch s;
  const std::string tpl = smollm2_template();
  const std::string dir = model_folder(s, {{"chat_template", tpl}, {"eos_token", "<|im_end|>"}});
  const Checkpoint hf = model::load_model(dir);
  model::save_model(hf, s / "m.gguf", {});
  const io::GGUFFile f = io::GGUFFile::open(s / "m.gguf");
  ASSERT_NE(f.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(f.find("tokenizer.chat_template")->as_string(), tpl);

  const Checkpoint gguf = model::load_model(s / "m.gguf");
  EXPECT_EQ(gguf.chat_template, tpl);
  model::save_model(gguf, s / "back", {"corelm", "f32", 0, {}});
  const json tc = json::parse(read_text(s / "back/tokenizer_config.json"));
  EXPECT_EQ(tc.at("chat_template"), tpl);
  const Checkpoint back = model::load_model(s / "back");
  EXPECT_EQ(back.chat_template, tpl);

  // A template that came from chat_template.jinja lands in tokenizer_config.json of the copy.
  write_text(dir + "/chat_template.jinja", "JINJA FILE");
  model::save_model(model::load_model(dir), s / "copy", {"hf", "f32", 0, {}});
  EXPECT_EQ(json::parse(read_text(s / "copy/tokenizer_config.json")).at("chat_template"), "JINJA FILE");
  EXPECT_EQ(model::load_model(s / "copy").chat_template, "JINJA FILE");
}

// An unchanged copied tokenizer_config.json is left as it was (a list of templates stays a list).
TEST(ChatTemplateRoundTrip, CopiedTokenizerConfigIsNotRewritten) {
  Scratch s;
  const json list = json::array({{{"name", "default"}, {"template", "D"}}, {{"name", "tool_use"}, {"template", "T"}}});
  const std::string dir = model_folder(s, {{"chat_template", list}, {"bos_token", "<s>"}, {"eos_token", "</s>"}});
  const std::string before = read_text(dir + "/tokenizer_config.json");
  model::save_model(model::load_model(dir), s / "copy", {"hf", "f32", 0, {}});
  EXPECT_EQ(read_text(s / "copy/tokenizer_config.json"), before);
}

}  // namespace
}  // namespace corelm
