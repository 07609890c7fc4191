#include "corelm/mpi.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "corelm/error.h"

#ifdef CORELM_HAVE_MPI
// The C API only: OpenMPI's mpi.h otherwise pulls in the deprecated C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace corelm::dist {

bool built_with_mpi() {
#ifdef CORELM_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

// MPI counts are ints: long buffers go in pieces of at most this many elements.
constexpr size_t kMaxCount = static_cast<size_t>(INT_MAX) / 2;

struct PendingReduce::Impl {
#ifdef CORELM_HAVE_MPI
  MPI_Request request = MPI_REQUEST_NULL;
#endif
};

PendingReduce::PendingReduce() = default;
PendingReduce::PendingReduce(PendingReduce&&) noexcept = default;
PendingReduce& PendingReduce::operator=(PendingReduce&& other) noexcept {
  if (this != &other) {
    wait();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
PendingReduce::~PendingReduce() { wait(); }

bool PendingReduce::pending() const {
#ifdef CORELM_HAVE_MPI
  return impl_ && impl_->request != MPI_REQUEST_NULL;
#else
  return false;
#endif
}

bool PendingReduce::test() {
#ifdef CORELM_HAVE_MPI
  if (!pending()) return true;
  int done = 0;
  MPI_Test(&impl_->request, &done, MPI_STATUS_IGNORE);
  return done != 0;
#else
  return true;
#endif
}

void PendingReduce::wait() {
#ifdef CORELM_HAVE_MPI
  if (pending()) MPI_Wait(&impl_->request, MPI_STATUS_IGNORE);
#endif
}

World::World(bool force) {
  if (!force && !launched_by_mpi()) return;
#ifdef CORELM_HAVE_MPI
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    // Only the main thread calls MPI; worker threads (--threads, reader threads) never do.
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    owns_init_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  active_ = true;
#else
  throw ValueError(
      "this corelm was built without MPI (install libopenmpi-dev and re-configure); run one process, or split a "
      "corpus run with --shard i/N");
#endif
}

World::~World() {
#ifdef CORELM_HAVE_MPI
  if (owns_init_) MPI_Finalize();
#endif
}

void World::barrier() const {
#ifdef CORELM_HAVE_MPI
  if (active_) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

#ifdef CORELM_HAVE_MPI
namespace {
template <class T>
void allreduce_pieces(T* data, size_t n, MPI_Datatype type, MPI_Op op) {
  for (size_t at = 0; at < n; at += kMaxCount)
    MPI_Allreduce(MPI_IN_PLACE, data + at, static_cast<int>(std::min(kMaxCount, n - at)), type, op, MPI_COMM_WORLD);
}
}  // namespace
#endif

void World::allreduce_sum(float* data, size_t n) const {
#ifdef CORELM_HAVE_MPI
  if (active_ && size_ > 1) allreduce_pieces(data, n, MPI_FLOAT, MPI_SUM);
#endif
}

void World::allreduce_sum(double* data, size_t n) const {
#ifdef CORELM_HAVE_MPI
  if (active_ && size_ > 1) allreduce_pieces(data, n, MPI_DOUBLE, MPI_SUM);
#endif
}

void World::allreduce_max(int64_t* data, size_t n) const {
#ifdef CORELM_HAVE_MPI
  if (active_ && size_ > 1) allreduce_pieces(data, n, MPI_INT64_T, MPI_MAX);
#endif
}

PendingReduce World::iallreduce_sum(float* data, size_t n) const {
  PendingReduce p;
#ifdef CORELM_HAVE_MPI
  if (active_ && size_ > 1) {
    CORELM_CHECK(n <= kMaxCount, ValueError, "iallreduce_sum: ", n, " elements exceed one MPI message (", kMaxCount,
                 "); use smaller buckets");
    p.impl_ = std::make_unique<PendingReduce::Impl>();
    MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &p.impl_->request);
  }
#endif
  return p;
}

void World::broadcast(void* data, size_t bytes, int root) const {
#ifdef CORELM_HAVE_MPI
  if (!active_ || size_ == 1) return;
  char* p = static_cast<char*>(data);
  for (size_t at = 0; at < bytes; at += kMaxCount)
    MPI_Bcast(p + at, static_cast<int>(std::min(kMaxCount, bytes - at)), MPI_BYTE, root, MPI_COMM_WORLD);
#endif
}

std::vector<uint64_t> World::allgather(uint64_t value) const {
#ifdef CORELM_HAVE_MPI
  if (active_ && size_ > 1) {
    std::vector<uint64_t> all(static_cast<size_t>(size_));
    MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
    return all;
  }
#endif
  return {value};
}

std::vector<double> World::gather(const std::vector<double>& values) const {
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

void World::abort(int code) const {
#ifdef CORELM_HAVE_MPI
  if (active_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace corelm::dist
