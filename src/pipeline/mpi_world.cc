#include "pipeline/mpi_world.h"

#include <cstdlib>

#include "corelm/error.h"

#ifdef CORELM_HAVE_MPI
// The C API only: OpenMPI's mpi.h otherwise pulls in the deprecated C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace corelm::pipeline {

static bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

MpiWorld::MpiWorld(bool force) {
  if (!force && !launched_by_mpirun()) return;
#ifdef CORELM_HAVE_MPI
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPI_Init(nullptr, nullptr);
    owns_init_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  active_ = true;
#else
  throw ValueError("this corelm was built without MPI (install libopenmpi-dev and re-configure); use --shard i/N");
#endif
}

MpiWorld::~MpiWorld() {
#ifdef CORELM_HAVE_MPI
  if (owns_init_) MPI_Finalize();
#endif
}

void MpiWorld::barrier() const {
#ifdef CORELM_HAVE_MPI
  if (active_) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

std::vector<double> MpiWorld::gather(const std::vector<double>& values) const {
#ifdef CORELM_HAVE_MPI
  if (active_) {
    std::vector<double> all(rank_ == 0 ? values.size() * size_ : 0);
    MPI_Gather(values.data(), static_cast<int>(values.size()), MPI_DOUBLE, all.data(),
               static_cast<int>(values.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return all;
  }
#endif
  return values;
}

void MpiWorld::abort(int code) const {
#ifdef CORELM_HAVE_MPI
  if (active_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace corelm::pipeline
