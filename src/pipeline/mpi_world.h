// The MPI side of a run, compiled to a one-process stub without MPI. MPI is initialised only when
// the process was launched by mpirun (OMPI_COMM_WORLD_SIZE / PMI_SIZE set) or `--mpi` asks for it.
#pragma once
#include <vector>

namespace corelm::pipeline {

class MpiWorld {
 public:
  explicit MpiWorld(bool force);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  bool active() const { return active_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  void barrier() const;
  // Every rank's `values` (same length everywhere), concatenated in rank order, at rank 0.
  std::vector<double> gather(const std::vector<double>& values) const;
  [[noreturn]] void abort(int code) const;

 private:
  bool active_ = false, owns_init_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace corelm::pipeline
