// ggml block types beyond Q8_0/Q4_0 (src/io/ggml_quants.h): the geometry table, the
// quantise -> dequantise error of every type corelm writes, and malformed tensors of the new types (each error naming the file and the tensor).
// Bit-exactness of every decoder against the `gguf` package is tests/oracle/test_gguf_quants_oracle.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "corelm/error.h"
#include "corelm/gguf.h"
#include "corelm/random.h"
#include "io/ggml_quants.h"

namespace corelm::io {
namespace {

namespace fs = std::filesystem;

class GGMLQuants : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corelm_ggml_quants_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  fs::path dir_;
};

// The table agrees with the public helpers and with the layouts' byte counts, derived here from
// the fields of each block (scales + code bits), not copied from the table.
TEST(GGMLTypeTable, GeometryFollowsFromTheFields) {
  struct Expect {
    GGMLType t;
    int64_t block;
    uint64_t bytes;
  };
  const Expect expect[] = {
      {GGMLType::Q4_0, 32, 2 + 32 * 4 / 8},          {GGMLType::Q4_1, 32, 2 + 2 + 32 * 4 / 8},
      {GGMLType::Q5_0, 32, 2 + 32 * 5 / 8},          {GGMLType::Q5_1, 32, 2 + 2 + 32 * 5 / 8},
      {GGMLType::Q8_0, 32, 2 + 32},                  {GGMLType::Q2_K, 256, 16 + 256 * 2 / 8 + 2 + 2},
      {GGMLType::Q3_K, 256, 256 * 3 / 8 + 12 + 2},   {GGMLType::Q4_K, 256, 2 + 2 + 12 + 256 * 4 / 8},
      {GGMLType::Q5_K, 256, 2 + 2 + 12 + 256 * 5 / 8}, {GGMLType::Q6_K, 256, 256 * 6 / 8 + 16 + 2},
  };
  for (const auto& e : expect) {
    const GGMLTypeInfo& i = ggml_type_info(e.t);
    EXPECT_EQ(i.block_values, e.block) << i.name;
    EXPECT_EQ(i.block_bytes, e.bytes) << i.name;
    EXPECT_EQ(ggml_block_size(e.t), e.block) << i.name;
    EXPECT_EQ(ggml_nbytes(e.t, 3 * e.block), 3 * e.bytes) << i.name;
    std::string lower = i.name;
    for (auto& c : lower) c = static_cast<char>(std::tolower(c));
    EXPECT_EQ(ggml_type_from_name(lower), e.t);
  }
  EXPECT_FALSE(ggml_can_write(GGMLType::Q2_K));
  EXPECT_FALSE(ggml_can_write(GGMLType::Q3_K));
  EXPECT_TRUE(ggml_can_write(GGMLType::Q6_K));
  EXPECT_EQ(ggml_type_info(20u), nullptr);  // IQ4_NL: not read
  EXPECT_THROW(ggml_type_from_name("iq4_nl"), ValueError);
}

// Every writable type, on N(0, 1) rows (plus a block of zeros and one of a constant): the
// round-trip error relative to the data's scale is bounded per type, and more bits give less
// error. Bounds are about 1.5x the measured value (printed), so a broken encoder fails them.
TEST_F(GGMLQuants, RoundTripErrorBoundedPerType) {
  Generator gen(7);
  Tensor x = Tensor::randn({8, 1024}, gen);
  std::vector<float> v = x.to_float_vector();
  for (int i = 0; i < 256; ++i) v[i] = 0.0f, v[256 + i] = 0.75f;  // degenerate blocks
  x = Tensor::from_vector(v, {8, 1024});
  struct Case {
    GGMLType t;
    double max_rms;  // RMS error / RMS of x
  };
  const Case cases[] = {{GGMLType::Q8_0, 0.008}, {GGMLType::Q6_K, 0.025}, {GGMLType::Q5_0, 0.06},
                        {GGMLType::Q5_1, 0.05},  {GGMLType::Q5_K, 0.05},  {GGMLType::Q4_0, 0.12},
                        {GGMLType::Q4_1, 0.10},  {GGMLType::Q4_K, 0.10}};
  std::vector<GGUFWriteTensor> ts;
  for (const auto& c : cases) ts.push_back({ggml_type_name(c.t), x, c.t});
  save_gguf(path("q.gguf"), {}, ts);
  auto f = GGUFFile::open(path("q.gguf"));
  double ref = 0;
  for (float a : v) ref += double(a) * a;
  ref = std::sqrt(ref / v.size());
  for (const auto& c : cases) {
    EXPECT_EQ(f.info(ggml_type_name(c.t)).type, c.t);
    const std::vector<float> y = f.get(ggml_type_name(c.t)).to_float_vector();
    double se = 0, worst = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      se += double(y[i] - v[i]) * (y[i] - v[i]);
      worst = std::max(worst, double(std::abs(y[i] - v[i])));
    }
    const double rms = std::sqrt(se / v.size()) / ref;
    std::printf("round trip %s: rms err / rms x = %.4f, max |err| = %.4f\n", ggml_type_name(c.t), rms, worst);
    EXPECT_LE(rms, c.max_rms) << ggml_type_name(c.t);
    EXPECT_LE(worst, 0.5) << ggml_type_name(c.t);  // ~ half a 4-bit step of a 3-sigma range
    for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.0f) << ggml_type_name(c.t) << " zeros";
    for (int i = 256; i < 512; ++i) EXPECT_NEAR(y[i], 0.75f, 0.75f * 2e-3) << ggml_type_name(c.t) << " constant";
  }
}

// Encoders fill every byte of a block from the input: two encodings of the same data are equal
// (no uninitialised padding) and a block survives decode -> encode -> decode unchanged once its
// values are on the grid (the encoders pick the same codes again, or codes just as close).
TEST(GGMLQuantsBlocks, EncodersAreDeterministicAndStableOnTheirGrid) {
  Generator gen(3);
  const std::vector<float> x = Tensor::randn({512}, gen).to_float_vector();
  for (GGMLType t : {GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K}) {
    const GGMLTypeInfo& q = ggml_type_info(t);
    const int64_t nb = 512 / q.block_values;
    std::vector<uint8_t> a(nb * q.block_bytes, 0xAB), b(nb * q.block_bytes, 0x11);
    q.encode(x.data(), nb, a.data());
    q.encode(x.data(), nb, b.data());
    EXPECT_EQ(a, b) << q.name;
    std::vector<float> y(512), z(512);
    q.decode(a.data(), nb, y.data());
    std::vector<uint8_t> c(a.size());
    q.encode(y.data(), nb, c.data());
    q.decode(c.data(), nb, z.data());
    double e1 = 0, e2 = 0;
    for (int i = 0; i < 512; ++i) e1 += std::abs(y[i] - x[i]), e2 += std::abs(z[i] - y[i]);
    EXPECT_LE(e2, e1 * 0.5) << q.name << ": re-encoding decoded values should be nearly lossless";
  }
}

TEST_F(GGMLQuants, WriterRefusesWhatItCannotWrite) {
  Generator gen(2);
  EXPECT_THROW(save_gguf(path("a.gguf"), {}, {{"w", Tensor::randn({2, 256}, gen), GGMLType::Q2_K}}), ValueError);
  try {
    save_gguf(path("b.gguf"), {}, {{"w.k", Tensor::randn({2, 288}, gen), GGMLType::Q4_K}});
    ADD_FAILURE() << "a Q4_K row of 288 was written";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'w.k'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("block size 256"), std::string::npos) << e.what();
  }
}

// Hand-built one-tensor GGUF files of the new types: the header is patched to be malformed.
class GGMLQuantsBadFiles : public GGMLQuants {
 protected:
  // A valid file holding one tensor "blk.0.w" of `t` with `rows` rows of `cols`.
  std::string valid(GGMLType t, int64_t rows, int64_t cols) {
    Generator gen(4);
    save_gguf(path("ok.gguf"), {}, {{"blk.0.w", Tensor::randn({rows, cols}, gen), t}});
    std::ifstream in(path("ok.gguf"), std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Offsets of n_dims, ne[0], ne[1] and the type after the name.
  static size_t at(const std::string& b, size_t field) { return b.find("blk.0.w") + 7 + field; }
  template <typename T> static void poke(std::string& b, size_t pos, T v) { std::memcpy(b.data() + pos, &v, sizeof(T)); }
  void write(const std::string& name, const std::string& b) { std::ofstream(path(name), std::ios::binary) << b; }
  void expect_error(const std::string& name, const std::vector<std::string>& parts) {
    try {
      GGUFFile f = GGUFFile::open(path(name));
      (void)f.get("blk.0.w");
      ADD_FAILURE() << name << " opened and decoded";
    } catch (const FormatError& e) {
      for (const auto& s : parts) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  }
};

TEST_F(GGMLQuantsBadFiles, TruncatedRowLengthAndOverflow) {
  // Truncated data of a k-quant and of a legacy type.
  for (GGMLType t : {GGMLType::Q6_K, GGMLType::Q5_1}) {
    const std::string b = valid(t, 2, 256);
    write("trunc.gguf", b.substr(0, b.size() - 40));
    expect_error("trunc.gguf", {"trunc.gguf", "blk.0.w", ggml_type_name(t), "past the end"});
  }
  // A row length the block does not divide (ne[0] = 128 for Q4_K, 48 for Q5_0).
  std::string b = valid(GGMLType::Q4_K, 2, 256);
  poke<uint64_t>(b, at(b, 4), 128);
  poke<uint64_t>(b, at(b, 12), 4);  // same total values: only the row length is wrong
  write("row.gguf", b);
  expect_error("row.gguf", {"row.gguf", "blk.0.w", "row length", "128", "Q4_K block size 256"});
  b = valid(GGMLType::Q5_0, 2, 64);
  poke<uint64_t>(b, at(b, 4), 48);
  write("row32.gguf", b);
  expect_error("row32.gguf", {"row32.gguf", "blk.0.w", "48", "Q5_0 block size 32"});
  // Sizes whose product overflows 64 bits.
  b = valid(GGMLType::Q4_K, 1, 256);
  poke<uint64_t>(b, at(b, 4), 1ull << 40);
  poke<uint64_t>(b, at(b, 12), 1ull << 40);
  write("huge.gguf", b);
  expect_error("huge.gguf", {"huge.gguf", "blk.0.w", "impossible"});
  // A type corelm does not read (IQ2_XXS = 16) is named as such.
  b = valid(GGMLType::Q4_K, 1, 256);
  poke<uint32_t>(b, at(b, 20), 16);
  write("iq.gguf", b);
  expect_error("iq.gguf", {"iq.gguf", "blk.0.w", "unsupported ggml type 16", "Q6_K=14"});
}

// Q2_K packs more than 3 values per byte: a file made mostly of one Q2_K tensor has more values
// than twice its size, which an older bound refused.
TEST_F(GGMLQuantsBadFiles, DenseQ2KTensorOpens) {
  std::vector<uint8_t> blocks(64 * 84);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t b = 0; b < 64; ++b) {  // finite scales
    const f16 d = float_to_f16(0.01f), m = float_to_f16(0.002f);
    std::memcpy(&blocks[b * 84 + 80], &d, 2);
    std::memcpy(&blocks[b * 84 + 82], &m, 2);
  }
  std::string b = valid(GGMLType::Q4_K, 1, 256);  // header template: 1 row
  const size_t data_start = b.size() - 160;  // one 144-byte block, padded to the 32-byte alignment
  poke<uint64_t>(b, at(b, 4), 64 * 256);
  poke<uint32_t>(b, at(b, 20), static_cast<uint32_t>(GGMLType::Q2_K));
  b.resize(data_start);
  b.append(reinterpret_cast<const char*>(blocks.data()), blocks.size());
  write("q2k.gguf", b);
  ASSERT_GT(64 * 256, 2 * static_cast<int64_t>(b.size()));
  auto f = GGUFFile::open(path("q2k.gguf"));
  std::vector<float> want(64 * 256);
  decode_q2_k(blocks.data(), 64, want.data());
  EXPECT_EQ(f.get("blk.0.w").to_float_vector(), want);
}

}  // namespace
}  // namespace corelm::io
