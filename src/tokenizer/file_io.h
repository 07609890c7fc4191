// Whole-file reads for tokenizer files; a name ending in .zst is decompressed on the fly.
#pragma once
#include <string>

namespace corelm::tok {

std::string read_file(const std::string& path);  // throws IOError naming the path
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);
// Decompresses a zstd frame (FormatError naming `source` on corruption).
std::string zstd_decompress(const std::string& data, const std::string& source);

}  // namespace corelm::tok
