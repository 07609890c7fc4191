// The output directory's commit protocol. A chunk is committed by (1) its errors file and (2) its
// part file, each written to a temp name and renamed, then (3) one journal line appended and
// fsynced. Only journal lines count as done, so a kill at any point leaves either a committed
// chunk or one that is redone (rewriting the same bytes under the same names). Each process
// appends to its own journal; lines carry the run identity, and a torn last line is ignored.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace corelm::pipeline {

struct ChunkStats {
  int64_t chunk = 0, records = 0, errors = 0, input_tokens = 0;
  double seconds = 0;
};

std::string part_name(int64_t chunk);    // part-00000012.jsonl
std::string errors_name(int64_t chunk);  // errors-00000012.jsonl

class OutputDir {
 public:
  // Creates DIR if needed and checks DIR/run.json against `identity` (model + task hashes):
  // a different identity is a ValueError unless `overwrite`, which deletes the other run's parts,
  // errors, journals and manifest and adopts the new identity.
  OutputDir(std::string dir, const nlohmann::ordered_json& identity, bool overwrite, const std::string& journal_tag);
  const std::string& dir() const { return dir_; }
  // Chunks committed by any process of this run identity.
  std::map<int64_t, ChunkStats> done() const;
  // Removes temp files left by killed writers of these chunks.
  void discard_temps(const std::vector<int64_t>& chunks) const;
  void commit(const ChunkStats& stats, const std::string& part_lines, const std::string& error_lines);
  void write_json(const std::string& name, const nlohmann::ordered_json& j) const;

 private:
  void clear_outputs() const;
  std::string dir_, journal_, run_id_;
};

}  // namespace corelm::pipeline
