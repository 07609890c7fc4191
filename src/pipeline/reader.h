// Reading one chunk: lines -> JSON records -> (id, text) -> prepared prompts, with every bad line
// turned into an error item naming the reason. Runs on the reader thread.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeline/engine.h"
#include "pipeline/input.h"

namespace corelm::pipeline {

struct Item {
  int64_t line = 0;
  nlohmann::json id;
  std::optional<PreparedDoc> doc;  // empty: `error` says why
  std::string error;
};

struct ChunkWork {
  Chunk chunk;
  std::vector<Item> items;  // in line order; blank lines are not records
};

class ChunkReader {
 public:
  ChunkReader(const Plan& plan, const TaskSpec& spec, const Engine& engine, int64_t max_line_bytes)
      : plan_(plan), spec_(spec), engine_(engine), max_line_bytes_(max_line_bytes) {}
  ChunkWork read(const Chunk& chunk);

 private:
  Item parse_line(const std::string& file, int64_t line_no, const std::string& line, bool too_long) const;
  const Plan& plan_;
  const TaskSpec& spec_;
  const Engine& engine_;
  int64_t max_line_bytes_;
  std::unique_ptr<LineReader> reader_;
  int open_file_ = -1;
};

}  // namespace corelm::pipeline
