// The MPI communicator of a multi-process job (src/dist: corelm_dist, the only library that links
// MPI): the corpus runner splits chunks by rank, data-parallel training all-reduces gradients.
// Without MPI, or in a process not started by an MPI launcher, it is a one-process world whose
// collectives are copies or no-ops, so callers need no second code path. MPI is initialised only
// when the process was launched by mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set)
// or `force` asks for it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace corelm::dist {

// Whether this binary was built with MPI (libopenmpi-dev at configure time).
bool built_with_mpi();
// Whether an MPI launcher started this process (reads the launchers' environment variables).
bool launched_by_mpi();

// An all-reduce in flight (World::iallreduce_sum). The buffer must stay alive and untouched until
// wait() returns (or test() returned true). Destroying a pending one waits for it.
class PendingReduce {
 public:
  PendingReduce();
  PendingReduce(PendingReduce&&) noexcept;
  PendingReduce& operator=(PendingReduce&&) noexcept;
  ~PendingReduce();
  bool test();  // true once complete; also lets MPI progress the operation
  void wait();
  bool pending() const;

 private:
  friend class World;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class World {
 public:
  // ValueError when `force` (or a launcher) asks for MPI and the binary was built without it.
  explicit World(bool force = false);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  bool active() const { return active_; }  // MPI initialised (possibly with one rank)
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }

  void barrier() const;
  // Element-wise sums over all ranks, in place (every rank gets the same bytes).
  void allreduce_sum(float* data, size_t n) const;
  void allreduce_sum(double* data, size_t n) const;
  void allreduce_max(int64_t* data, size_t n) const;
  // Non-blocking sum in place; n must fit an int (callers bucket their buffers).
  PendingReduce iallreduce_sum(float* data, size_t n) const;
  // `bytes` bytes at `root` copied to every rank.
  void broadcast(void* data, size_t bytes, int root = 0) const;
  // One value per rank, in rank order, on every rank.
  std::vector<uint64_t> allgather(uint64_t value) const;
  // Every rank's `values` (same length everywhere), concatenated in rank order, at rank 0.
  std::vector<double> gather(const std::vector<double>& values) const;
  // Ends every rank of the job (MPI_Abort), or this process without MPI.
  [[noreturn]] void abort(int code) const;

 private:
  bool active_ = false, owns_init_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace corelm::dist
