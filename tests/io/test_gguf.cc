// GGUF reader/writer: metadata of every value type and tensors of every ggml type round trip,
// the quantisation error bounds, and one negative test per kind of malformed file, each
// checking that the message names the file (and the tensor or key).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "corelm/error.h"
#include "corelm/gguf.h"
#include "corelm/random.h"

namespace corelm::io {
namespace {

namespace fs = std::filesystem;
using KV = std::vector<std::pair<std::string, GGUFValue>>;

class GGUFTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_gguf_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  static std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static void write(const std::string& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }
  // Expects FormatError from opening `p` whose message contains every one of `parts`.
  static void expect_format_error(const std::string& p, const std::vector<std::string>& parts) {
    try {
      GGUFFile::open(p);
      ADD_FAILURE() << p << " opened";
    } catch (const FormatError& e) {
      for (const auto& s : parts) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

// 0, 1, ..., n-1 as f32 (built by hand: these tests should not depend on dtype conversion).
Tensor iota(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return Tensor::from_vector(v, {n});
}

KV all_value_types() {
  using T = GGUFType;
  return {
      {"general.architecture", GGUFValue::of_string("llama")},
      {"t.u8", GGUFValue::of(T::Uint8, 200)},
      {"t.i8", GGUFValue::of(T::Int8, -100)},
      {"t.u16", GGUFValue::of(T::Uint16, 60000)},
      {"t.i16", GGUFValue::of(T::Int16, -30000)},
      {"t.u32", GGUFValue::of(T::Uint32, 4000000000ll)},
      {"t.i32", GGUFValue::of(T::Int32, -2000000000)},
      {"t.u64", GGUFValue::of(T::Uint64, 1ll << 62)},
      {"t.i64", GGUFValue::of(T::Int64, -(1ll << 62))},
      {"t.f32", GGUFValue::of_float(T::Float32, 0.1)},
      {"t.f64", GGUFValue::of_float(T::Float64, 0.1)},
      {"t.bool", GGUFValue::of(T::Bool, 1)},
      {"t.str", GGUFValue::of_string(std::string("caf\xc3\xa9\0x", 7))},
      {"tokenizer.ggml.tokens", GGUFValue::of_strings({"<unk>", "<s>", "</s>", "\xe2\x96\x81hi"})},
      {"tokenizer.ggml.merges", GGUFValue::of_strings({"h i", "\xe2\x96\x81 hi"})},
      {"tokenizer.ggml.scores", GGUFValue::of_array(T::Float32, {GGUFValue::of_float(T::Float32, -1.5),
                                                                 GGUFValue::of_float(T::Float32, 2)})},
      {"t.arr_i32", GGUFValue::of_array(T::Int32, {GGUFValue::of(T::Int32, -1), GGUFValue::of(T::Int32, 7)})},
      {"t.nested", GGUFValue::of_array(T::Array, {GGUFValue::of_array(T::Uint8, {GGUFValue::of(T::Uint8, 3)})})},
      {"t.empty", GGUFValue::of_array(T::Bool, {})},
  };
}

TEST_F(GGUFTest, RoundTripsMetadataAndTensorsOfEveryType) {
  Generator gen(7);
  Tensor a = Tensor::randn({3, 64}, gen);
  Tensor b = Tensor::randn({2, 3, 5}, gen);
  Tensor c = Tensor::randn({4, 32}, gen);
  KV kv = all_value_types();
  std::vector<GGUFWriteTensor> ts = {{"f32", b, GGMLType::F32},      {"f16", a, GGMLType::F16},
                                     {"bf16", a, GGMLType::BF16},    {"q8", a, GGMLType::Q8_0},
                                     {"q4", c, GGMLType::Q4_0},      {"vec", iota(7), GGMLType::F32}};
  save_gguf(path("m.gguf"), kv, ts);
  auto f = GGUFFile::open(path("m.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, kv[i].first);
    EXPECT_TRUE(f.metadata()[i].second == kv[i].second) << kv[i].first;
  }
  EXPECT_EQ(f.at("t.u32").as_int(), 4000000000ll);
  EXPECT_EQ(f.at("t.str").as_string().size(), 7u);
  EXPECT_THROW(f.at("t.str").as_int(), FormatError);  // read from a file: the file is at fault
  EXPECT_THROW(GGUFValue::of_string("x").as_int(), ValueError);  // built in memory: the caller is
  EXPECT_THROW(f.at("nope"), IndexError);
  ASSERT_EQ(f.tensors().size(), ts.size());
  EXPECT_EQ(f.info("f32").ne, (std::vector<int64_t>{5, 3, 2}));  // ggml order
  EXPECT_EQ(f.get("f32").to_float_vector(), b.to_float_vector());
  EXPECT_EQ(f.get("f32").shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(f.get("f16").dtype(), DType::F16);
  EXPECT_EQ(f.get("f16").to_float_vector(), a.to(DType::F16).to_float_vector());
  EXPECT_EQ(f.get("bf16").to_float_vector(), a.to(DType::BF16).to_float_vector());
  EXPECT_EQ(f.get("vec").to_float_vector(), iota(7).to_float_vector());
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
  // Re-writing what we read gives the same bytes (F32 tensors, same metadata).
  save_gguf(path("m2.gguf"), f.metadata(), {{"f32", f.get("f32"), GGMLType::F32}});
  save_gguf(path("m3.gguf"), kv, {{"f32", b, GGMLType::F32}});
  EXPECT_EQ(slurp(path("m2.gguf")), slurp(path("m3.gguf")));
  EXPECT_THROW(f.get("missing"), IndexError);
}

TEST_F(GGUFTest, QuantisationErrorBounds) {
  Generator gen(3);
  Tensor x = Tensor::randn({8, 256}, gen);
  save_gguf(path("q.gguf"), {}, {{"q8", x, GGMLType::Q8_0}, {"q4", x, GGMLType::Q4_0}});
  auto f = GGUFFile::open(path("q.gguf"));
  EXPECT_EQ(f.info("q8").nbytes, 8u * 256 / 32 * 34);
  EXPECT_EQ(f.info("q4").nbytes, 8u * 256 / 32 * 18);
  const auto xv = x.to_float_vector(), q8 = f.get("q8").to_float_vector(), q4 = f.get("q4").to_float_vector();
  double worst8 = 0, worst4 = 0;
  for (size_t blk = 0; blk < xv.size() / 32; ++blk) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xv[blk * 32 + j]));
    for (size_t j = 0; j < 32; ++j) {
      const size_t k = blk * 32 + j;
      // Q8_0: half a step (amax/127) plus the f16 rounding of the scale. Q4_0's codes span
      // -8..7 steps of amax/8 with the extreme value at -8, so the opposite extreme is clamped
      // to 7: up to one whole step there.
      EXPECT_LE(std::abs(q8[k] - xv[k]), amax / 127 * 0.5 + amax * 1e-3 + 1e-7) << k;
      EXPECT_LE(std::abs(q4[k] - xv[k]), amax / 8 + amax * 2e-3 + 1e-7) << k;
      worst8 = std::max(worst8, std::abs(double(q8[k]) - xv[k]) / amax);
      worst4 = std::max(worst4, std::abs(double(q4[k]) - xv[k]) / amax);
    }
  }
  std::cout << "max |err|/amax per block: Q8_0 " << worst8 << ", Q4_0 " << worst4 << "\n";
  EXPECT_THROW(save_gguf(path("bad.gguf"), {}, {{"odd", Tensor::zeros({2, 33}), GGMLType::Q8_0}}), ValueError);
}

TEST_F(GGUFTest, AlignmentKeyIsHonoured) {
  KV kv = {{"general.alignment", GGUFValue::of(GGUFType::Uint32, 64)}};
  save_gguf(path("a.gguf"), kv, {{"x", iota(3), GGMLType::F32}, {"y", iota(5), GGMLType::F32}});
  auto f = GGUFFile::open(path("a.gguf"));
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.info("y").offset, 64u);
  EXPECT_EQ(f.get("y").to_float_vector(), iota(5).to_float_vector());
}

// Issue 13: arrays are kept in their file encoding, not one object per element (a 16M-element
// uint8 array took 2.9 GB), and every element type still reads back through the accessors.
TEST_F(GGUFTest, ArraysKeepTheirEncodingAndReadBackTyped) {
  using T = GGUFType;
  const size_t n = 1 << 20;
  GGUFArray bytes(T::Uint8);
  for (size_t k = 0; k < n; ++k) bytes.push_back(GGUFValue::of(T::Uint8, static_cast<int64_t>(k * 7 % 251)));
  std::vector<std::string> words;
  for (int k = 0; k < 1000; ++k) words.push_back("w" + std::to_string(k));
  KV kv = {{"big", GGUFValue::of_array(bytes)},
           {"words", GGUFValue::of_strings(words)},
           {"i64", GGUFValue::of_ints(T::Int64, {-5, 1ll << 40})},
           {"u64", GGUFValue::of_ints(T::Uint64, {-1})},
           {"f64", GGUFValue::of_array(T::Float64, {GGUFValue::of_float(T::Float64, 0.25)})},
           {"flags", GGUFValue::of_array(T::Bool, {GGUFValue::of(T::Bool, 1), GGUFValue::of(T::Bool, 0)})},
           {"nested", GGUFValue::of_array(T::Array, {GGUFValue::of_strings({"a", "bc"}), GGUFValue::of_ints(T::Int8, {-3})})}};
  save_gguf(path("arr.gguf"), kv, {});
  auto f = GGUFFile::open(path("arr.gguf"));
  const GGUFArray& big = f.at("big").as_array(T::Uint8);
  ASSERT_EQ(big.size(), n);
  EXPECT_EQ(big.encoded().size(), n);  // one byte per element, as in the file
  EXPECT_EQ(big.int_at(n - 1), static_cast<int64_t>((n - 1) * 7 % 251));
  EXPECT_EQ(big.ints().size(), n);
  EXPECT_EQ(f.at("words").as_array(T::String).string_at(999), "w999");
  EXPECT_EQ(f.at("words").array.strings(), words);
  EXPECT_EQ(f.at("words").array[3].as_string(), "w3");
  EXPECT_EQ(f.at("i64").array.ints(), (std::vector<int64_t>{-5, 1ll << 40}));
  EXPECT_EQ(f.at("f64").array.floats(), (std::vector<double>{0.25}));
  EXPECT_EQ(f.at("flags").array.ints(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(f.at("big").array.float_at(1), 7.0);
  const GGUFArray& nested = f.at("nested").as_array(T::Array);
  EXPECT_EQ(nested.array_at(0).strings(), (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(nested.array_at(1).int_at(0), -3);
  EXPECT_EQ(nested[1].array.type(), T::Int8);
  EXPECT_THROW(big.int_at(n), IndexError);
  // uint64 beyond int64 is refused by name rather than wrapped to a negative number.
  try {
    f.at("u64").array.int_at(0);
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("metadata 'u64'[0] = 18446744073709551615"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.at("u64").array.float_at(0), 18446744073709551615.0);
  // Round trip: the same bytes again.
  save_gguf(path("arr2.gguf"), f.metadata(), {});
  EXPECT_EQ(slurp(path("arr.gguf")), slurp(path("arr2.gguf")));
}

// Issue 13, defect 16: a metadata type error names the file, the key and both types.
TEST_F(GGUFTest, TypeErrorsNameFileKeyAndTypes) {
  using T = GGUFType;
  KV kv = {{"tokenizer.ggml.bos_token_id", GGUFValue::of_string("1")},
           {"tokenizer.ggml.tokens", GGUFValue::of_ints(T::Int32, {1, 2})},
           {"big", GGUFValue::of(T::Uint64, -1)},
           {"id", GGUFValue::of(T::Uint32, 4000000000ll)}};
  save_gguf(path("types.gguf"), kv, {});
  auto f = GGUFFile::open(path("types.gguf"));
  auto expect_error = [&](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      ADD_FAILURE() << "no throw";
    } catch (const FormatError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  const std::string file = path("types.gguf");
  expect_error([&] { f.at("tokenizer.ggml.bos_token_id").as_int(); },
               {file, "'tokenizer.ggml.bos_token_id'", "is string, expected an integer"});
  expect_error([&] { f.at("tokenizer.ggml.tokens").as_array(T::String); },
               {file, "'tokenizer.ggml.tokens'", "is array of int32, expected an array of string"});
  expect_error([&] { f.at("tokenizer.ggml.tokens").array.strings(); },
               {file, "'tokenizer.ggml.tokens'", "an array of int32, expected an array of strings"});
  expect_error([&] { f.at("tokenizer.ggml.tokens").as_string(); }, {file, "'tokenizer.ggml.tokens'", "expected a string"});
  expect_error([&] { f.at("big").as_int(); }, {file, "'big'", "18446744073709551615"});
  expect_error([&] { f.at("id").as_int(0, INT32_MAX); }, {file, "'id' = 4000000000 is outside [0, 2147483647]"});
  // Copies keep the context (the model loader stores the tokenizer keys for later writes).
  const GGUFValue copy = f.at("tokenizer.ggml.bos_token_id");
  expect_error([&] { copy.as_float(); }, {file, "'tokenizer.ggml.bos_token_id'", "expected a number"});
}

class GGUFBadFiles : public GGUFTest {
 protected:
  // A valid file with one F32 tensor "blk.0.w" [2, 32]; returns its bytes.
  std::string valid() {
    save_gguf(path("ok.gguf"), {{"general.architecture", GGUFValue::of_string("llama")}},
              {{"blk.0.w", Tensor::zeros({2, 32}), GGMLType::F32}});
    return slurp(path("ok.gguf"));
  }
  // Byte position of the tensor info fields after the name "blk.0.w".
  static size_t after_name(const std::string& b) { return b.find("blk.0.w") + 7; }
  template <typename T> static void poke(std::string& b, size_t pos, T v) { std::memcpy(b.data() + pos, &v, sizeof(T)); }
};

TEST_F(GGUFBadFiles, Truncated) {
  const std::string b = valid();
  write(path("t.gguf"), b.substr(0, b.size() - 10));
  expect_format_error(path("t.gguf"), {"t.gguf", "blk.0.w", "truncated"});
  write(path("h.gguf"), b.substr(0, 30));
  expect_format_error(path("h.gguf"), {"h.gguf", "truncated"});
  write(path("tiny.gguf"), "GGUF");
  expect_format_error(path("tiny.gguf"), {"tiny.gguf"});
}

TEST_F(GGUFBadFiles, WrongMagicAndVersion) {
  std::string b = valid();
  b[0] = 'X';
  write(path("m.gguf"), b);
  expect_format_error(path("m.gguf"), {"m.gguf", "magic"});
  b = valid();
  poke<uint32_t>(b, 4, 7);
  write(path("v.gguf"), b);
  expect_format_error(path("v.gguf"), {"v.gguf", "version 7"});
  EXPECT_THROW(GGUFFile::open(path("absent.gguf")), IOError);
}

TEST_F(GGUFBadFiles, AbsurdCounts) {
  std::string b = valid();
  poke<uint64_t>(b, 8, 1ull << 60);
  write(path("n.gguf"), b);
  expect_format_error(path("n.gguf"), {"n.gguf", "tensor count"});
  b = valid();
  poke<uint64_t>(b, 16, 1ull << 60);
  write(path("k.gguf"), b);
  expect_format_error(path("k.gguf"), {"k.gguf", "metadata count"});
  b = valid();
  poke<uint64_t>(b, 24, 1ull << 40);  // length of the first key
  write(path("s.gguf"), b);
  expect_format_error(path("s.gguf"), {"s.gguf", "metadata key #0"});
  b = valid();
  poke<uint32_t>(b, after_name(b), 9);  // n_dims
  write(path("d.gguf"), b);
  expect_format_error(path("d.gguf"), {"d.gguf", "blk.0.w", "9 dimensions"});
  b = valid();
  poke<uint64_t>(b, after_name(b) + 4, 1ull << 50);  // ne[0]
  write(path("e.gguf"), b);
  expect_format_error(path("e.gguf"), {"e.gguf", "blk.0.w", "dimension 0"});
}

TEST_F(GGUFBadFiles, OffsetOutOfBoundsAndMisaligned) {
  std::string b = valid();
  const size_t off_pos = after_name(b) + 4 + 16 + 4;
  poke<uint64_t>(b, off_pos, 1024);
  write(path("o.gguf"), b);
  expect_format_error(path("o.gguf"), {"o.gguf", "blk.0.w", "past the end"});
  poke<uint64_t>(b, off_pos, 4);
  write(path("a.gguf"), b);
  expect_format_error(path("a.gguf"), {"a.gguf", "blk.0.w", "alignment"});
}

TEST_F(GGUFBadFiles, UnknownTypes) {
  std::string b = valid();
  poke<uint32_t>(b, after_name(b) + 4 + 16, 99);  // ggml type
  write(path("t.gguf"), b);
  expect_format_error(path("t.gguf"), {"t.gguf", "blk.0.w", "ggml type 99"});
  b = valid();
  poke<uint32_t>(b, b.find("general.architecture") + 20, 42);  // value type
  write(path("v.gguf"), b);
  expect_format_error(path("v.gguf"), {"v.gguf", "general.architecture", "unknown type 42"});
}

// Damaged arrays: each error names the file and the key (and the element when it is one).
TEST_F(GGUFBadFiles, DamagedArrays) {
  using T = GGUFType;
  auto file_with = [&](const GGUFValue& v) {
    save_gguf(path("a.gguf"), {{"arr", v}}, {});
    return slurp(path("a.gguf"));
  };
  const size_t header = 4 + 4 + 8 + 8 + 8 + 3 + 4;  // magic .. key "arr", value type
  std::string b = file_with(GGUFValue::of_array(T::Bool, {GGUFValue::of(T::Bool, 1), GGUFValue::of(T::Bool, 0)}));
  b[header + 4 + 8 + 1] = 2;
  write(path("bool.gguf"), b);
  expect_format_error(path("bool.gguf"), {"bool.gguf", "metadata 'arr'[1]", "byte value 2"});
  b = file_with(GGUFValue::of_strings({"ab", "cd"}));
  poke<uint64_t>(b, header + 4 + 8 + 8 + 2, 1ull << 40);  // length of the second string
  write(path("str.gguf"), b);
  expect_format_error(path("str.gguf"), {"str.gguf", "metadata 'arr'", "truncated in element 1"});
  b = file_with(GGUFValue::of_strings({"ab"}));
  poke<uint64_t>(b, header + 4, 1ull << 40);  // element count
  write(path("count.gguf"), b);
  expect_format_error(path("count.gguf"), {"count.gguf", "metadata 'arr'", "claims 1099511627776 elements"});
  b = file_with(GGUFValue::of_array(T::Array, {GGUFValue::of_ints(T::Int8, {1})}));
  poke<uint32_t>(b, header + 4 + 8, 77);  // inner element type
  write(path("inner.gguf"), b);
  expect_format_error(path("inner.gguf"), {"inner.gguf", "metadata 'arr'[0]", "unknown element type 77"});
  GGUFValue deep = GGUFValue::of_ints(T::Int8, {1});
  for (int d = 0; d < 4; ++d) deep = GGUFValue::of_array(T::Array, {deep});
  write(path("deep.gguf"), file_with(deep));
  expect_format_error(path("deep.gguf"), {"deep.gguf", "metadata 'arr'", "nests arrays deeper than 4"});
}

TEST_F(GGUFBadFiles, BlockTypeShapeMismatch) {
  std::string b = valid();
  poke<uint32_t>(b, after_name(b) + 4 + 16, 8);  // Q8_0 with ne[0] = 32 is fine ...
  poke<uint64_t>(b, after_name(b) + 4, 31);      // ... but not with 31
  write(path("q.gguf"), b);
  expect_format_error(path("q.gguf"), {"q.gguf", "blk.0.w", "block size 32"});
}

// Real files written by llama.cpp's converter (vocab-only, 0 tensors) from the shared data set.
TEST(GGUFRealFiles, LlamaCppVocabFilesLoad) {
  const fs::path dir = fs::path(CORELM_SOURCE_DIR) / ".." / "shared" / "data" / "tokenizers" / "llama.cpp-vocab-tests";
  if (!fs::exists(dir / "ggml-vocab-llama-spm.gguf"))
    GTEST_SKIP() << "llama.cpp vocab GGUFs not found under " << dir.string() << " (shared data set absent)";
  auto spm = GGUFFile::open((dir / "ggml-vocab-llama-spm.gguf").string());
  EXPECT_EQ(spm.version(), 3u);
  EXPECT_EQ(spm.at("general.architecture").as_string(), "llama");
  EXPECT_EQ(spm.at("tokenizer.ggml.model").as_string(), "llama");
  const auto& tokens = spm.at("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.array.size(), 32000u);
  EXPECT_EQ(tokens.array[1].as_string(), "<s>");
  EXPECT_EQ(tokens.array[3].as_string(), "<0x00>");
  EXPECT_EQ(spm.at("tokenizer.ggml.scores").array.size(), 32000u);
  EXPECT_EQ(spm.at("tokenizer.ggml.bos_token_id").as_int(), 1);
  EXPECT_TRUE(spm.tensors().empty());
  auto gpt2 = GGUFFile::open((dir / "ggml-vocab-gpt-2.gguf").string());
  EXPECT_EQ(gpt2.at("tokenizer.ggml.model").as_string(), "gpt2");
  EXPECT_EQ(gpt2.at("tokenizer.ggml.tokens").array.size(), 50257u);
  EXPECT_EQ(gpt2.at("tokenizer.ggml.merges").array.size(), 50000u);
  EXPECT_EQ(gpt2.at("tokenizer.ggml.merges").array[0].as_string(), "\xc4\xa0 t");  // "Ġ t"
}

}  // namespace
}  // namespace corelm::io
