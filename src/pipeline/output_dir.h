// The output directory's commit protocol. A chunk is committed by (1) its errors file and (2) its
// part file, each written to a temp name and renamed, then (3) one journal line appended and
// fsynced. Only journal lines count as done, so a kill at any point leaves either a committed
// chunk or one that is redone (rewriting the same bytes under the same names). Each process
// appends to its own journal; lines carry the run identity, and a torn last line is ignored.
// Locks: OUT/run.lock (deciding the identity), OUT/run.active (held shared by every live writer),
// OUT/plan.lock (planning); all are flock(2) locks that die with their holder.
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
  // Creates DIR if needed and checks DIR/run.json against `identity` (model + task hashes), or
  // creates it, as one decision no concurrent process can interleave with: a different identity
  // is a ValueError naming both runs unless `overwrite`, which deletes the other run's parts,
  // errors, journals and manifest and adopts the new identity (refused while a process of the
  // other run is still alive). The object keeps this process registered as a live writer of the
  // identity until it is destroyed.
  OutputDir(std::string dir, const nlohmann::ordered_json& identity, bool overwrite, const std::string& journal_tag);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;
  const std::string& dir() const { return dir_; }
  // Chunks committed by any process of this run identity.
  std::map<int64_t, ChunkStats> done() const;
  // Removes temp files left by killed writers of these chunks.
  void discard_temps(const std::vector<int64_t>& chunks) const;
  void commit(const ChunkStats& stats, const std::string& part_lines, const std::string& error_lines);
  void write_json(const std::string& name, const nlohmann::ordered_json& j) const;

 private:
  void adopt_identity(const std::string& run_json, const std::string& text, const nlohmann::ordered_json& identity,
                      bool overwrite);
  void clear_outputs() const;
  std::string dir_, journal_, run_id_;
  int active_fd_ = -1;  // OUT/run.active, flock'ed shared while this process writes
};

}  // namespace corelm::pipeline
