// safetensors reader/writer: round trips for every dtype, zero-copy views, atomic writes, and a
// negative test per kind of malformed file, each checking the message names the file/tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "corelm/safetensors.h"

namespace corelm::io {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("corelm_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a raw safetensors file from a header string and a data section.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        int64_t claimed_len = -1) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    uint64_t len = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << data;
    return p;
  }

  fs::path dir_;
};

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Expects open() to throw E with every `needle` in the message.
template <typename E>
void expect_open_error(const std::string& p, std::initializer_list<std::string> needles) {
  try {
    SafetensorsFile::open(p);
    ADD_FAILURE() << "open(" << p << ") did not throw";
  } catch (const E& e) {
    std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "open(" << p << ") threw the wrong type: " << e.what();
  }
}

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  Tensor f = Tensor::from_vector(std::vector<float>{1.5f, -2.25f, 3.0f, 0.1f, -0.0f, 1e-30f}, {2, 3});
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", f},
      {"bf16", f.to(DType::BF16)},
      {"f16", f.to(DType::F16)},
      {"i32", Tensor::from_vector(std::vector<int32_t>{1, -2, 2147483647, -2147483647 - 1}, {4})},
      {"i64", Tensor::from_vector(std::vector<int64_t>{int64_t{1} << 40, -7}, {2, 1})},
      {"i8", Tensor::from_vector(std::vector<int32_t>{-128, 127, 0}, {3}).to(DType::I8)},
      {"u8", Tensor::from_vector(std::vector<int32_t>{0, 255, 7, 9, 11}, {5}).to(DType::U8)},
      {"scalar", Tensor::full({}, 4.0)},
      {"empty", Tensor::zeros({0, 3})},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "héllo \"quoted\""}};
  save_safetensors(path("a.safetensors"), tensors, meta);

  auto file = SafetensorsFile::open(path("a.safetensors"));
  ASSERT_EQ(file.names().size(), tensors.size());
  EXPECT_EQ(file.metadata(), meta);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, ref] = tensors[i];
    EXPECT_EQ(file.names()[i], name) << "file order";
    ASSERT_TRUE(file.contains(name));
    Tensor t = file.get(name);
    EXPECT_EQ(t.dtype(), ref.dtype()) << name;
    EXPECT_EQ(t.shape(), ref.shape()) << name;
    ASSERT_EQ(t.nbytes(), ref.nbytes()) << name;
    if (ref.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(t.raw_data(), ref.contiguous().raw_data(), ref.nbytes()), 0) << name;
    }
  }
  // The header is padded so the data section starts 8-byte aligned.
  std::string bytes = read_all(path("a.safetensors"));
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  // The header parses as plain JSON with the reference format's fields.
  auto header = nlohmann::json::parse(bytes.substr(8, header_len));
  EXPECT_EQ(header["f32"]["dtype"], "F32");
  EXPECT_EQ(header["bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["u8"]["shape"], nlohmann::json::array({5}));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
}

TEST_F(SafetensorsTest, NoTensorsAndNoMetadata) {
  save_safetensors(path("e.safetensors"), {});
  auto file = SafetensorsFile::open(path("e.safetensors"));
  EXPECT_TRUE(file.names().empty());
  EXPECT_TRUE(file.metadata().empty());
}

TEST_F(SafetensorsTest, NonContiguousInputIsWrittenInLogicalOrder) {
  Tensor base = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = base.transpose(0, 1);  // [3, 2]: 0 3 1 4 2 5
  ASSERT_FALSE(t.is_contiguous());
  Tensor strided = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}, {8}).slice(0, 1, 8, 3);  // 1 4 7
  save_safetensors(path("t.safetensors"), {{"t", t}, {"s", strided}});
  auto file = SafetensorsFile::open(path("t.safetensors"));
  EXPECT_EQ(file.get("t").shape(), (Shape{3, 2}));
  EXPECT_EQ(file.get("t").to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(file.get("s").to_float_vector(), (std::vector<float>{1, 4, 7}));
}

TEST_F(SafetensorsTest, TensorsAreZeroCopyViewsOfOneMapping) {
  save_safetensors(path("z.safetensors"),
                   {{"a", Tensor::full({4, 4}, 1.0)}, {"b", Tensor::full({3}, 2.0)}, {"c", Tensor::full({2}, 3.0)}});
  auto file = SafetensorsFile::open(path("z.safetensors"));
  Tensor a = file.get("a"), b = file.get("b"), c = file.get("c");
  EXPECT_EQ(a.storage().get(), b.storage().get()) << "tensors share the file mapping";
  EXPECT_EQ(a.storage()->nbytes(), fs::file_size(path("z.safetensors")));
  EXPECT_EQ(file.get("a").raw_data(), a.raw_data()) << "get() does not copy";
  // The views keep the mapping alive after the file object is gone.
  { auto moved = std::move(file); }
  EXPECT_EQ(c.to_float_vector(), (std::vector<float>{3, 3}));
  // Writes go to private copy-on-write pages: the file is unchanged.
  a.data<float>()[0] = 42.0f;
  EXPECT_EQ(SafetensorsFile::open(path("z.safetensors")).get("a").to_float_vector()[0], 1.0f);
}

TEST_F(SafetensorsTest, WriterAlignsEveryTensor) {
  // Given order u8[3], f32, i64, bf16: the header keeps it, the data is laid out by element size.
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"u", Tensor::from_vector(std::vector<int32_t>{1, 2, 3}, {3}).to(DType::U8)},
      {"f", Tensor::from_vector(std::vector<float>{1.25f, -8.0f, 3.0f}, {3})},
      {"l", Tensor::from_vector(std::vector<int64_t>{5, -6}, {2})},
      {"h", Tensor::from_vector(std::vector<float>{0.5f}, {1}).to(DType::BF16)}};
  save_safetensors(path("al.safetensors"), tensors);
  auto file = SafetensorsFile::open(path("al.safetensors"));
  EXPECT_EQ(file.names(), (std::vector<std::string>{"u", "f", "l", "h"}));
  for (const auto& [name, ref] : tensors) {
    Tensor t = file.get(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % dtype_size(t.dtype()), 0u) << name;
    EXPECT_EQ(t.storage().get(), file.get("u").storage().get()) << name << " is a view of the mapping";
    EXPECT_EQ(t.to_float_vector(), ref.to_float_vector()) << name;
  }
}

TEST_F(SafetensorsTest, MisalignedTensorOffsetsStillLoad) {
  // Other writers may put an f32 at an odd offset: it loads (as an aligned copy).
  std::string data = {1, 2, 3};
  float f[2] = {1.25f, -8.0f};
  data.append(reinterpret_cast<const char*>(f), 8);
  std::string p = write_raw(
      "m.safetensors",
      R"({"u": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}, "f": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]}})",
      data);
  auto file = SafetensorsFile::open(p);
  EXPECT_EQ(file.get("f").to_float_vector(), (std::vector<float>{1.25f, -8.0f}));
  EXPECT_EQ(file.get("u").to_int_vector(), (std::vector<int64_t>{1, 2, 3}));
}

TEST_F(SafetensorsTest, SaveReplacesAtomicallyAndLeavesNoTempFiles) {
  save_safetensors(path("r.safetensors"), {{"x", Tensor::full({2}, 1.0)}});
  auto old_view = SafetensorsFile::open(path("r.safetensors")).get("x");
  save_safetensors(path("r.safetensors"), {{"x", Tensor::full({2}, 5.0)}, {"y", Tensor::full({1}, 6.0)}});
  EXPECT_EQ(SafetensorsFile::open(path("r.safetensors")).get("x").to_float_vector(), (std::vector<float>{5, 5}));
  // The old mapping still sees the old file (rename, not overwrite in place).
  EXPECT_EQ(old_view.to_float_vector(), (std::vector<float>{1, 1}));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "r.safetensors");
  }
  EXPECT_EQ(files, 1);
}

TEST_F(SafetensorsTest, WriteFileAtomic) {
  write_file_atomic(path("w.txt"), "hello");
  write_file_atomic(path("w.txt"), "world!");
  EXPECT_EQ(read_all(path("w.txt")), "world!");
  EXPECT_THROW(write_file_atomic(path("no_such_dir/w.txt"), "x"), IOError);
}

TEST_F(SafetensorsTest, WriterRejectsBadNames) {
  Tensor t = Tensor::full({1}, 1.0);
  EXPECT_THROW(save_safetensors(path("b.safetensors"), {{"x", t}, {"x", t}}), ValueError);
  EXPECT_THROW(save_safetensors(path("b.safetensors"), {{"__metadata__", t}}), ValueError);
  EXPECT_THROW(save_safetensors(path("b.safetensors"), {{"u", Tensor()}}), ValueError);
  EXPECT_FALSE(fs::exists(path("b.safetensors")));
}

TEST_F(SafetensorsTest, UnknownNameIsIndexError) {
  save_safetensors(path("n.safetensors"), {{"x", Tensor::full({1}, 1.0)}});
  auto file = SafetensorsFile::open(path("n.safetensors"));
  try {
    file.get("nope");
    FAIL();
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("n.safetensors"), std::string::npos);
  }
}

// ---- malformed files ----

TEST_F(SafetensorsTest, MissingFile) {
  expect_open_error<IOError>(path("missing.safetensors"), {"missing.safetensors"});
}

TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  std::string p = path("short.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  expect_open_error<FormatError>(p, {"short.safetensors", "too short"});
}

TEST_F(SafetensorsTest, TruncatedFile) {
  save_safetensors(path("full.safetensors"), {{"w", Tensor::full({64}, 1.0)}});
  std::string bytes = read_all(path("full.safetensors"));
  std::ofstream(path("cut.safetensors"), std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  expect_open_error<FormatError>(path("cut.safetensors"), {"cut.safetensors", "'w'", "outside the data section"});
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  std::string p = write_raw("len.safetensors", "{}", "", 1000);
  expect_open_error<FormatError>(p, {"len.safetensors", "header length 1000", "past the end"});
  std::string huge = write_raw("huge.safetensors", "{}", "", int64_t{1} << 40);
  expect_open_error<FormatError>(huge, {"huge.safetensors", "exceeds the limit"});
}

TEST_F(SafetensorsTest, BadJson) {
  std::string p = write_raw("json.safetensors", R"({"w": {"dtype": "F32", )", "");
  expect_open_error<FormatError>(p, {"json.safetensors", "not valid JSON"});
  std::string arr = write_raw("arr.safetensors", "[1, 2]", "");
  expect_open_error<FormatError>(arr, {"arr.safetensors", "JSON object"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  std::string p =
      write_raw("dt.safetensors", R"({"weights": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})",
                std::string(8, '\0'));
  expect_open_error<FormatError>(p, {"dt.safetensors", "'weights'", "F64"});
}

TEST_F(SafetensorsTest, OffsetOutOfRange) {
  std::string p = write_raw("off.safetensors", R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                            std::string(8, '\0'));
  expect_open_error<FormatError>(p, {"off.safetensors", "'w'", "[8, 16]"});
}

TEST_F(SafetensorsTest, SizeMismatch) {
  std::string p = write_raw("size.safetensors", R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                            std::string(16, '\0'));
  expect_open_error<FormatError>(p, {"size.safetensors", "'w'", "needs 12"});
}

TEST_F(SafetensorsTest, Overlap) {
  std::string p = write_raw(
      "ov.safetensors",
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
      std::string(12, '\0'));
  expect_open_error<FormatError>(p, {"ov.safetensors", "'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsTest, BadShapeAndFields) {
  std::string neg = write_raw("neg.safetensors", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", "");
  expect_open_error<FormatError>(neg, {"neg.safetensors", "'w'", "non-negative"});
  std::string huge = write_raw("big.safetensors",
                               R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})", "");
  expect_open_error<FormatError>(huge, {"big.safetensors", "'w'", "impossibly large"});
  std::string missing = write_raw("mf.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", "");
  expect_open_error<FormatError>(missing, {"mf.safetensors", "'w'", "data_offsets"});
  std::string meta = write_raw("meta.safetensors", R"({"__metadata__": {"a": 1}})", "");
  expect_open_error<FormatError>(meta, {"meta.safetensors", "__metadata__", "'a'"});
  std::string dup = write_raw(
      "dup.safetensors",
      R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
      std::string(2, '\0'));
  expect_open_error<FormatError>(dup, {"dup.safetensors", "duplicate", "'w'"});
  // Found by fuzz_safetensors_header: a number beyond 64 bits made the JSON parser throw its
  // out_of_range exception, which escaped as a non-corelm error (a crash in the CLI).
  std::string overflow = write_raw("ovf.safetensors",
                                   R"({"w": {"dtype": "F16", "shape": [)" + std::string(400, '8') + "]}}", "");
  expect_open_error<FormatError>(overflow, {"ovf.safetensors", "not valid JSON"});
}

}  // namespace
}  // namespace corelm::io

namespace corelm::io {
namespace {

// Corrupting random header bytes must give a corelm::Error or a file whose tensors all lie in
// bounds, never a crash (run under the sanitizer build to catch out-of-bounds reads).
TEST_F(SafetensorsTest, CorruptedHeadersNeverCrash) {
  save_safetensors(path("ok.safetensors"), {{"a", Tensor::full({3, 4}, 1.0)},
                                            {"bb", Tensor::full({5}, 2.0).to(DType::BF16)},
                                            {"c", Tensor::full({2}, 3.0).to(DType::I64)}},
                   {{"k", "v"}});
  const std::string good = read_all(path("ok.safetensors"));
  uint64_t header_len;
  std::memcpy(&header_len, good.data(), 8);
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int opened = 0, rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(next() % 3);
    for (int f = 0; f < flips; ++f) {
      // Mostly the header (where validation matters), sometimes the length field.
      size_t pos = next() % 5 == 0 ? next() % 8 : 8 + next() % header_len;
      bytes[pos] = static_cast<char>(next() % 5 == 0 ? next() & 0xff : "0123456789[]{},:\" -"[next() % 19]);
    }
    if (next() % 10 == 0) bytes.resize(next() % bytes.size());
    const std::string p = path("fuzz.safetensors");
    {
      std::ofstream out(p, std::ios::binary | std::ios::trunc);
      out << bytes;
    }
    try {
      auto file = SafetensorsFile::open(p);
      for (const auto& n : file.names()) {
        Tensor t = file.get(n);
        if (t.numel() > 0) (void)t.to_float_vector();
      }
      ++opened;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("corrupted headers: %d rejected, %d still valid\n", rejected, opened);
}

}  // namespace
}  // namespace corelm::io
