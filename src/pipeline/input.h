// Reading the corpus: input patterns -> files; a file (plain, gzip or zstd, told apart by magic
// bytes) -> lines, each cut off at a byte limit; the run plan that cuts every file into chunks of
// K lines and assigns chunks to shards balanced by bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace corelm::pipeline {

// Each pattern is a file or a glob (its matches sorted); order of the patterns is kept. A pattern
// matching nothing is an IOError naming it; a file given twice is a ValueError.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

// Decompressed bytes of one file.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to n bytes into buf; 0 at the end. IOError/FormatError naming the file on failure.
  virtual size_t read(char* buf, size_t n) = 0;
  static std::unique_ptr<ByteSource> open(const std::string& path);
  // Plain files only: positions the next read at `offset`. Returns false for compressed input.
  virtual bool seek(uint64_t offset) { return false; }
};

class LineReader {
 public:
  LineReader(std::string path, int64_t max_line_bytes);
  // Next line without its '\n' (and '\r'). A line longer than the limit is skipped to its end and
  // returned empty with too_long set. False at the end of the file.
  bool next(std::string& line, bool& too_long);
  int64_t line_number() const { return line_no_; }   // of the line last returned (1-based)
  uint64_t offset() const { return offset_; }        // decompressed bytes consumed so far
  // Positions at the start of line `line_no` (1-based) that begins at decompressed byte `offset`:
  // a seek for plain files, reading and dropping lines for compressed ones.
  void skip_to(int64_t line_no, uint64_t offset);

 private:
  bool fill();
  std::string path_;
  int64_t max_;
  std::unique_ptr<ByteSource> src_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_no_ = 0;
  uint64_t offset_ = 0;
};

// K consecutive lines of one file: the unit of work, output and commit.
struct Chunk {
  int64_t index = 0;       // global, in plan order: the part file's number
  int file = 0;            // index into Plan::files
  int64_t first_line = 1;  // 1-based
  int64_t lines = 0;
  uint64_t offset = 0;     // decompressed byte offset of first_line
  uint64_t bytes = 0;
};

struct Plan {
  std::vector<std::string> files;
  std::vector<uint64_t> file_bytes;  // decompressed
  std::vector<Chunk> chunks;
  uint64_t total_bytes = 0;
  std::vector<std::string> empty_files;
  // Chunks of shard i of n: a contiguous run of chunks holding about total_bytes / n bytes.
  std::vector<int64_t> shard_chunks(int i, int n) const;
};

// Reads every file once (decompressing) to find chunk boundaries.
Plan make_plan(const std::vector<std::string>& files, int64_t chunk_lines);

}  // namespace corelm::pipeline
