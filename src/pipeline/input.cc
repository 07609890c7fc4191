// Input files: glob expansion, transparent gzip/zstd decompression, bounded line reading and the
// chunk plan.
#include "pipeline/input.h"

#include <fcntl.h>
#include <glob.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "corelm/error.h"

namespace corelm::pipeline {
namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

class Fd {
 public:
  explicit Fd(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw IOError(path + ": cannot open: " + std::strerror(errno));
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  size_t read(char* buf, size_t n) {
    for (;;) {
      ssize_t r = ::read(fd_, buf, n);
      if (r >= 0) return static_cast<size_t>(r);
      if (errno != EINTR) throw IOError(path_ + ": read failed: " + std::strerror(errno));
    }
  }
  bool seek(uint64_t off) { return ::lseek(fd_, static_cast<off_t>(off), SEEK_SET) >= 0; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

class PlainSource : public ByteSource {
 public:
  explicit PlainSource(const std::string& path) : fd_(path) {}
  size_t read(char* buf, size_t n) override { return fd_.read(buf, n); }
  bool seek(uint64_t offset) override {
    if (!fd_.seek(offset)) throw IOError(fd_.path() + ": cannot seek to byte " + std::to_string(offset));
    return true;
  }

 private:
  Fd fd_;
};

// gzip through inflate itself rather than gzread: gzread reports a file cut inside a member as a
// short read (its Z_BUF_ERROR only shows through gzerror) and skips whatever follows the last
// member, so a truncated or damaged file would read as a clean end of file. Members follow one
// another (multi-member files from `cat a.gz b.gz` or pigz); after the last one only zero
// padding may follow, as gzip(1) itself tolerates.
class GzipSource : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : fd_(path), in_(size_t(1) << 17) {
    CORELM_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, IOError, path, ": cannot start the gzip decoder");
  }
  ~GzipSource() override { inflateEnd(&zs_); }
  size_t read(char* buf, size_t n) override {
    if (done_ || n == 0) return 0;
    zs_.next_out = reinterpret_cast<Bytef*>(buf);
    const uInt want = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    zs_.avail_out = want;
    while (zs_.avail_out == want) {  // until some output (an empty member gives none)
      if (zs_.avail_in == 0 && !refill()) {
        // The file ended. Between members (or at the start of padding) that is the end; inside a
        // member it is a truncated file.
        if (!in_member_) {
          done_ = true;
          break;
        }
        throw FormatError(fd_.path() + ": truncated gzip stream: the file ends at byte " + std::to_string(consumed()) +
                          " inside the gzip member that starts at byte " + std::to_string(member_start_));
      }
      if (!in_member_) {
        // Bytes after a complete member: another member, zero padding, or garbage.
        const unsigned char c = *zs_.next_in;
        if (c == 0) {  // padding; once it starts, only zeros may follow
          padding_ = true;
          ++zs_.next_in;
          --zs_.avail_in;
          continue;
        }
        if (padding_ || c != 0x1f) throw trailing_garbage();
        member_start_ = consumed();
        in_member_ = true;
        CORELM_CHECK(inflateReset(&zs_) == Z_OK, IOError, fd_.path(), ": cannot restart the gzip decoder");
      }
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw FormatError(fd_.path() + ": corrupt gzip data near byte " + std::to_string(consumed()) +
                          " (gzip member starting at byte " + std::to_string(member_start_) +
                          "): " + (zs_.msg ? zs_.msg : "inflate error " + std::to_string(rc)));
      }
    }
    return want - zs_.avail_out;
  }

 private:
  bool refill() {
    const size_t got = fd_.read(in_.data(), in_.size());
    read_ += got;
    zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
    zs_.avail_in = static_cast<uInt>(got);
    return got > 0;
  }
  uint64_t consumed() const { return read_ - zs_.avail_in; }
  FormatError trailing_garbage() const {
    return FormatError(fd_.path() + ": unexpected data after the end of the gzip stream at byte " +
                       std::to_string(consumed()) + " (not a gzip member; the file is damaged or not gzip)");
  }

  Fd fd_;
  std::vector<char> in_;
  z_stream zs_{};
  uint64_t read_ = 0, member_start_ = 0;
  bool in_member_ = true, padding_ = false, done_ = false;
};

// zstd frames follow one another; the stream must end on a frame boundary.
class ZstdSource : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path) : fd_(path), in_(ZSTD_DStreamInSize()) {
    ds_ = ZSTD_createDStream();
    ZSTD_initDStream(ds_);
  }
  ~ZstdSource() override { ZSTD_freeDStream(ds_); }
  size_t read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (ib_.pos == ib_.size) {
        size_t got = fd_.read(in_.data(), in_.size());
        if (got == 0) {
          if (!frame_done_)
            throw FormatError(fd_.path() + ": truncated zstd stream: the file ends at byte " + std::to_string(read_) +
                              " inside the zstd frame that starts at byte " + std::to_string(frame_start_));
          return 0;
        }
        read_ += got;
        ib_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      if (frame_done_) frame_start_ = consumed();
      size_t rc = ZSTD_decompressStream(ds_, &out, &ib_);
      if (ZSTD_isError(rc))
        throw FormatError(fd_.path() + ": corrupt zstd data near byte " + std::to_string(consumed()) +
                          " (zstd frame starting at byte " + std::to_string(frame_start_) +
                          "): " + ZSTD_getErrorName(rc));
      frame_done_ = rc == 0;
    }
    return out.pos;
  }

 private:
  uint64_t consumed() const { return read_ - (ib_.size - ib_.pos); }
  Fd fd_;
  std::vector<char> in_;
  ZSTD_inBuffer ib_{nullptr, 0, 0};
  ZSTD_DStream* ds_ = nullptr;
  uint64_t read_ = 0, frame_start_ = 0;
  bool frame_done_ = true;
};

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const auto& p : patterns) {
    if (!has_glob_chars(p)) {
      CORELM_CHECK(::access(p.c_str(), R_OK) == 0, IOError, "--input ", p, ": ", std::strerror(errno));
      files.push_back(p);
      continue;
    }
    glob_t g{};
    int rc = ::glob(p.c_str(), 0, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    CORELM_CHECK(!matches.empty(), IOError, "--input ", p, ": no file matches this pattern");
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  CORELM_CHECK(!files.empty(), ValueError, "--input: no input files given");
  std::set<std::string> seen;
  for (const auto& f : files) CORELM_CHECK(seen.insert(f).second, ValueError, "--input: ", f, " is given twice");
  return files;
}

std::unique_ptr<ByteSource> ByteSource::open(const std::string& path) {
  std::string head(4, '\0');
  size_t got = 0;
  {
    Fd probe(path);
    while (got < 4) {
      size_t r = probe.read(head.data() + got, 4 - got);
      if (r == 0) break;
      got += r;
    }
  }
  head.resize(got);
  const auto* u = reinterpret_cast<const unsigned char*>(head.data());
  if (got >= 2 && u[0] == 0x1f && u[1] == 0x8b) return std::make_unique<GzipSource>(path);
  if (got >= 4 && u[0] == 0x28 && u[1] == 0xb5 && u[2] == 0x2f && u[3] == 0xfd) return std::make_unique<ZstdSource>(path);
  return std::make_unique<PlainSource>(path);
}

LineReader::LineReader(std::string path, int64_t max_line_bytes)
    : path_(std::move(path)), max_(max_line_bytes), src_(ByteSource::open(path_)), buf_(size_t(1) << 17) {}

bool LineReader::fill() {
  if (eof_) return false;
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    end_ -= pos_;
    pos_ = 0;
  }
  if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);
  size_t r = src_->read(buf_.data() + end_, buf_.size() - end_);
  if (r == 0) eof_ = true;
  end_ += r;
  return r > 0;
}

bool LineReader::next(std::string& line, bool& too_long) {
  line.clear();
  too_long = false;
  uint64_t length = 0;
  for (;;) {
    if (pos_ == end_ && !fill()) {
      if (length == 0 && !too_long) return false;  // end of file
      break;                                        // last line without '\n'
    }
    const char* start = buf_.data() + pos_;
    const char* nl = static_cast<const char*>(std::memchr(start, '\n', end_ - pos_));
    size_t take = nl ? static_cast<size_t>(nl - start) : end_ - pos_;
    length += take;
    if (!too_long && length > static_cast<uint64_t>(max_)) {
      too_long = true;
      line.clear();
      line.shrink_to_fit();
    }
    if (!too_long) line.append(start, take);
    pos_ += take;
    offset_ += take;
    if (nl) {
      ++pos_;
      ++offset_;
      break;
    }
  }
  ++line_no_;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

void LineReader::skip_to(int64_t line_no, uint64_t offset) {
  if (line_no <= line_no_ + 1) return;
  if (src_->seek(offset)) {
    pos_ = end_ = 0;
    eof_ = false;
    offset_ = offset;
    line_no_ = line_no - 1;
    return;
  }
  std::string scratch;
  bool too_long = false;
  while (line_no_ + 1 < line_no && next(scratch, too_long)) {
  }
}

std::vector<int64_t> Plan::shard_chunks(int i, int n) const {
  std::vector<int64_t> out;
  uint64_t before = 0;
  for (const Chunk& c : chunks) {
    // The chunk's midpoint decides its shard: contiguous runs of about total/n bytes each.
    const long double mid = static_cast<long double>(before) + c.bytes / 2.0L;
    int s = total_bytes == 0 ? 0 : static_cast<int>(mid * n / static_cast<long double>(total_bytes));
    s = std::clamp(s, 0, n - 1);
    if (s == i) out.push_back(c.index);
    before += c.bytes;
  }
  return out;
}

Plan make_plan(const std::vector<std::string>& files, int64_t chunk_lines) {
  CORELM_CHECK(chunk_lines > 0, ValueError, "--chunk-records must be positive, got ", chunk_lines);
  Plan plan;
  plan.files = files;
  std::vector<char> buf(size_t(1) << 20);
  for (size_t f = 0; f < files.size(); ++f) {
    auto src = ByteSource::open(files[f]);
    uint64_t offset = 0, chunk_start = 0;
    int64_t lines_in_chunk = 0, line = 0;
    bool mid_line = false;
    auto close_chunk = [&](uint64_t end) {
      Chunk c;
      c.index = static_cast<int64_t>(plan.chunks.size());
      c.file = static_cast<int>(f);
      c.first_line = line - lines_in_chunk + 1;
      c.lines = lines_in_chunk;
      c.offset = chunk_start;
      c.bytes = end - chunk_start;
      plan.chunks.push_back(c);
      chunk_start = end;
      lines_in_chunk = 0;
    };
    for (;;) {
      size_t got = src->read(buf.data(), buf.size());
      if (got == 0) break;
      const char* p = buf.data();
      const char* end = p + got;
      while (p < end) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
        if (!nl) {
          offset += end - p;
          mid_line = true;
          break;
        }
        offset += nl - p + 1;
        p = nl + 1;
        mid_line = false;
        ++line;
        if (++lines_in_chunk == chunk_lines) close_chunk(offset);
      }
    }
    if (mid_line) {
      ++line;
      ++lines_in_chunk;
    }
    if (lines_in_chunk > 0) close_chunk(offset);
    if (offset == 0) plan.empty_files.push_back(files[f]);
    plan.file_bytes.push_back(offset);
    plan.total_bytes += offset;
  }
  return plan;
}

}  // namespace corelm::pipeline
