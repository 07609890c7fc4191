// Hostile and real-world GGUF files against the real binary (issue 13): a huge metadata array
// inspected in bounded memory, non-UTF-8 strings escaped in `inspect` (text and --json), type
// errors naming the file and key, and a vocabulary lacking some single-byte tokens (as
// SmolLM2's does) loading and generating.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/cli_runner.h"
#include "common/process_limits.h"
#include "corelm/architecture.h"
#include "corelm/gguf.h"
#include "corelm/random.h"
#include "corelm/tensor.h"
#include "corelm/tokenizer.h"
#include "tokenizer/tiny_tokenizer.h"

namespace corelm {
namespace {

using testing::CliOptions;
using testing::run_corelm;
using testing::ScratchDir;
using KV = std::vector<std::pair<std::string, io::GGUFValue>>;
using T = io::GGUFType;

template <typename V> void put(std::string& b, V v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_str(std::string& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b += s;
}

// The tokenizer.ggml.* keys of a byte-level BPE tokenizer file (what `convert` writes).
KV bpe_metadata(const GgufBpeVocab& v) {
  std::vector<int64_t> types(v.token_types.begin(), v.token_types.end());
  KV kv = {{"tokenizer.ggml.model", io::GGUFValue::of_string("gpt2")},
           {"tokenizer.ggml.pre", io::GGUFValue::of_string(v.pre)},
           {"tokenizer.ggml.tokens", io::GGUFValue::of_strings(v.tokens)},
           {"tokenizer.ggml.token_type", io::GGUFValue::of_ints(T::Int32, types)},
           {"tokenizer.ggml.merges", io::GGUFValue::of_strings(v.merges)}};
  if (v.eos) kv.push_back({"tokenizer.ggml.eos_token_id", io::GGUFValue::of(T::Uint32, *v.eos)});
  return kv;
}

// A one-layer llama (hidden 16) with random weights and the given vocabulary; `edit` may alter
// the metadata before writing.
void write_tiny_model(const std::string& path, const GgufBpeVocab& vocab,
                      const std::function<void(KV&)>& edit = [](KV&) {}) {
  const int64_t V = static_cast<int64_t>(vocab.tokens.size()), H = 16, F = 32;
  nlohmann::json config = {{"model_type", "llama"}, {"hidden_size", H}, {"num_attention_heads", 2},
                           {"num_key_value_heads", 2}, {"head_dim", 8}, {"vocab_size", V},
                           {"num_hidden_layers", 1}, {"intermediate_size", F}, {"max_position_embeddings", 64}};
  Generator gen(5);
  auto w = [&](Shape s) { return Tensor::randn(s, gen, 0.2f); };
  const std::string p = "model.layers.0.";
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"model.embed_tokens.weight", w({V, H})},
      {p + "input_layernorm.weight", Tensor::ones({H})},
      {p + "self_attn.q_proj.weight", w({H, H})},
      {p + "self_attn.k_proj.weight", w({H, H})},
      {p + "self_attn.v_proj.weight", w({H, H})},
      {p + "self_attn.o_proj.weight", w({H, H})},
      {p + "post_attention_layernorm.weight", Tensor::ones({H})},
      {p + "mlp.gate_proj.weight", w({F, H})},
      {p + "mlp.up_proj.weight", w({F, H})},
      {p + "mlp.down_proj.weight", w({H, F})},
      {"model.norm.weight", Tensor::ones({H})}};
  KV extra = bpe_metadata(vocab);
  edit(extra);
  model::save_gguf_model(path, config, tensors, io::GGMLType::F32, extra);
}

// The single-byte tokens SmolLM2-135M's vocabulary lacks.
const std::vector<int> kSmolMissing = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5,
                                       0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF};

GgufBpeVocab tiny_vocab(const ScratchDir& d, bool missing_bytes) {
  test::TinySpec s;
  s.merges = {{"a", "b"}, {"h", "i"}, {" ", "hi"}};
  if (missing_bytes) s.missing_bytes = kSmolMissing;
  s.extra_tokens = {"<|endoftext|>"};
  const std::string file = d / "tokenizer.json";
  std::ofstream(file) << test::tiny_json(s).dump();
  return gguf_bpe_vocab_from_file(file);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Defect 9: a 17 MB file holding one 16M-element uint8 array took 2.9 GB in `inspect` (one
// variant object per element). Under a 1 GiB address-space limit it must now succeed.
TEST(GgufFaults, HugeMetadataArrayIsInspectedInBoundedMemory) {
  ScratchDir d("gguf_huge_array");
  const uint64_t n = uint64_t(1) << 24;
  std::string b = "GGUF";
  put<uint32_t>(b, 3);
  put<uint64_t>(b, 0);  // tensors
  put<uint64_t>(b, 1);  // metadata
  put_str(b, "big.array");
  put<uint32_t>(b, 9);  // array
  put<uint32_t>(b, 0);  // of uint8
  put<uint64_t>(b, n);
  b.append(n, '\x07');
  std::ofstream(d / "big.gguf", std::ios::binary) << b;
  CliOptions o;
  o.timeout_s = 60;
  // (Under AddressSanitizer no address-space limit can be set: its shadow memory needs terabytes.)
  if (!corelm::testing::kAddressSanitizer) o.as_limit = 1L << 30;
  const auto r = run_corelm({"inspect", "--json", d / "big.gguf"}, o);
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["metadata"]["big.array"], "[16777216 x uint8]");
}

// Defect 11: a GGUF string holding 0xFF ended `inspect` in "internal error: json type_error.316".
TEST(GgufFaults, NonUtf8StringsAreEscapedByInspect) {
  ScratchDir d("gguf_utf8");
  const std::string file = d / "bad\xFF.gguf";  // a legal Linux file name
  io::save_gguf(file,
                {{"general.architecture", io::GGUFValue::of_string("llama")},
                 {"general.name", io::GGUFValue::of_string("bad\xFFname")},
                 {"weird.\xFE.key", io::GGUFValue::of_strings({"ok", "x\xC0y"})}},
                {{"t\xFF", Tensor::zeros({4}), io::GGMLType::F32}});
  CliOptions o;
  o.timeout_s = 30;
  const auto text = run_corelm({"inspect", file}, o);
  ASSERT_EQ(text.rc, 0) << text.all();
  EXPECT_TRUE(contains(text.out, "bad\\\\xFFname")) << text.out;  // JSON-dumped: the backslash doubled
  EXPECT_TRUE(contains(text.out, "t\\xFF")) << text.out;
  const auto js = run_corelm({"inspect", "--json", file}, o);
  ASSERT_EQ(js.rc, 0) << js.all();
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["metadata"]["general.name"], "bad\\xFFname");
  EXPECT_EQ(j["metadata"]["weird.\\xFE.key"][1], "x\\xC0y");
  EXPECT_EQ(j["tensors"][0]["name"], "t\\xFF");
  EXPECT_TRUE(contains(j["path"].get<std::string>(), "bad\\xFF.gguf")) << j["path"];
}

// Defect 11, the tokenizer side: a control token that is not UTF-8 loads (GGUF strings are
// bytes, llama.cpp takes them) but cannot go into a tokenizer.json: `convert --to hf` says so
// by key and index instead of ending in "internal error: json type_error.316".
TEST(GgufFaults, NonUtf8ControlTokenLoadsButIsRefusedByNameForTokenizerJson) {
  ScratchDir d("gguf_utf8_token");
  GgufBpeVocab v = tiny_vocab(d, false);
  v.tokens.push_back("<bad\xFF>");
  v.token_types.push_back(3);
  const std::string file = d / "m.gguf";
  write_tiny_model(file, v);
  CliOptions o;
  o.timeout_s = 60;
  const auto g = run_corelm({"generate", "--model", file, "--prompt", "hi", "-n", "2"}, o);
  EXPECT_EQ(g.rc, 0) << g.all();
  const auto c = run_corelm({"convert", file, d / "hf", "--to", "hf"}, o);
  EXPECT_NE(c.rc, 0);
  const std::string id = std::to_string(v.tokens.size() - 1);
  EXPECT_TRUE(contains(c.err, "tokenizer.ggml.tokens[" + id + "] ('<bad\\xFF>') is not valid UTF-8")) << c.err;
  EXPECT_FALSE(contains(c.err, "internal error")) << c.err;
}

// Defect 16: a metadata value of the wrong type is reported with the file, the key and both types.
TEST(GgufFaults, TypeErrorsNameFileAndKey) {
  ScratchDir d("gguf_types");
  const GgufBpeVocab v = tiny_vocab(d, false);
  CliOptions o;
  o.timeout_s = 60;
  struct Case {
    std::string key;
    io::GGUFValue value;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"tokenizer.ggml.eos_token_id", io::GGUFValue::of_string("2"), "is string, expected an integer"},
      {"tokenizer.ggml.tokens", io::GGUFValue::of_ints(T::Int32, {1, 2}), "is array of int32, expected an array of string"},
      {"tokenizer.ggml.merges", io::GGUFValue::of(T::Uint32, 3), "is uint32, expected an array of string"},
      {"tokenizer.ggml.token_type", io::GGUFValue::of_strings({"1"}), "is array of string, expected an array of int32"},
      {"tokenizer.ggml.eos_token_id", io::GGUFValue::of(T::Uint64, int64_t(1) << 40), "is outside [0, 2147483647]"},
      {"llama.block_count", io::GGUFValue::of_string("1"), "block_count"},
      {"llama.block_count", io::GGUFValue::of_float(T::Float32, 1.5), "block_count = 1.5 is not a whole number"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string file = d / ("m" + std::to_string(i) + ".gguf");
    write_tiny_model(file, v, [&](KV& kv) {
      for (auto& [k, val] : kv)
        if (k == c.key) val = c.value;
    });
    if (c.key.starts_with("llama.")) {
      // An architecture key: rewrite it after the fact (save_gguf_model writes those itself).
      io::GGUFFile f = io::GGUFFile::open(file);
      KV kv = f.metadata();
      for (auto& [k, val] : kv)
        if (k == c.key) val = c.value;
      std::vector<io::GGUFWriteTensor> ts;
      for (const auto& t : f.tensors()) ts.push_back({t.name, f.get(t.name).to(DType::F32).contiguous(), t.type});
      io::save_gguf(file + ".tmp", kv, ts);
      std::filesystem::rename(file + ".tmp", file);
    }
    const auto r = run_corelm({"generate", "--model", file, "--prompt", "hi", "-n", "2"}, o);
    EXPECT_NE(r.rc, 0) << c.key;
    EXPECT_TRUE(contains(r.err, file) && contains(r.err, c.key) && contains(r.err, c.expect)) << c.key << ": " << r.err;
    EXPECT_FALSE(contains(r.err, "internal error")) << r.err;
  }
}

// "Real models from the wild must load": a vocabulary without SmolLM2's 21 single-byte tokens
// was refused ("model.vocab has no token for byte 0x4"); it now loads, generates, converts.
TEST(GgufFaults, VocabularyWithoutSomeByteTokensLoads) {
  ScratchDir d("gguf_missing_bytes");
  const std::string file = d / "smol_like.gguf";
  write_tiny_model(file, tiny_vocab(d, true));
  CliOptions o;
  o.timeout_s = 60;
  const auto r = run_corelm({"generate", "--model", file, "--prompt", "a\x04" "b hi", "-n", "3"}, o);
  ASSERT_EQ(r.rc, 0) << r.all();
  const auto c = run_corelm({"convert", file, d / "hf", "--to", "hf"}, o);
  ASSERT_EQ(c.rc, 0) << c.all();
  auto tok = Tokenizer::load(d / "hf");
  // The GPT-2 regex makes "\x04" a pre-token of its own: it is dropped and "a", "b" stay apart.
  EXPECT_EQ(test::pieces(*tok, tok->encode("a\x04" "b hi")), (std::vector<std::string>{"a", "b", " hi"}));
}

}  // namespace
}  // namespace corelm
