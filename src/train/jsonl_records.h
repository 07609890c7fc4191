// The JSON Lines reading the training data loaders share (SFT pairs, classification records).
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "corelm/error.h"

namespace corelm::train::detail {

// Calls fn(record, where) for each non-blank line of the JSONL file at path, where is
// "path:line" so that the caller's field errors name the line as the parse errors do. A CR
// before the newline is dropped (files written on Windows). Throws IOError when path cannot be
// opened and FormatError on a line that is not JSON; the record's shape is the caller's to check.
template <class Fn>
void for_each_jsonl_record(const std::string& path, Fn&& fn) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(where + ": invalid JSON: " + e.what());
    }
    fn(j, where);
  }
}

}  // namespace corelm::train::detail
