// Data-parallel training over MPI (docs/SCALE-OUT.md "Data-parallel training"): every rank holds
// the whole model and optimizer; all ranks draw the same global micro-batch of size() x --batch rows
// from the same seeded sampler (so the data position is global and a checkpoint resumes with any
// number of ranks) and rank r trains on rows [r*batch, (r+1)*batch). Each rank's loss is weighted
// by its share of the global batch's target tokens, so the summed gradient is the gradient of the
// one-process loss on the global batch, masked (SFT) targets included. Gradients are summed in
// buckets: a bucket's MPI_Iallreduce starts as soon as backward has finished all its gradients
// (autograd::LeafGradHookScope) and runs while backward computes the rest. With identical
// gradients every rank applies the identical AdamW update; a periodic checksum of the parameter
// bytes proves it. Without a world of more than one rank every call here is a no-op.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/mpi.h"
#include "corelm/random.h"
#include "corelm/tensor.h"
#include "corelm/train.h"

namespace corelm::train {

// The ranks' parameters differ after an update that should have been identical (a rank's
// arithmetic or memory went wrong): the message names the step and the ranks.
class ReplicasDiverged : public Error {
  using Error::Error;
};

// One all-reduce message: parameters (indices into the parameter list) packed back to back.
struct GradientBucket {
  std::vector<size_t> params;
  std::vector<int64_t> offsets;  // element offset of each parameter in the bucket
  int64_t numel = 0;
};

// Parameters of `numels` elements in reverse order (backward finishes the last layers first), cut
// into buckets of at most `bucket_bytes` bytes of fp32: a parameter that does not fit into the
// current bucket starts the next one, and one larger than the size is a bucket of its own. Every
// parameter is in exactly one bucket. ValueError for bucket_bytes < 4.
std::vector<GradientBucket> plan_buckets(const std::vector<int64_t>& numels, int64_t bucket_bytes);

// 64-bit hash of the bytes of `tensors` (f32, in order): the replicas' checksum.
uint64_t parameter_checksum(const std::vector<Tensor>& tensors);

// What rank 0 sends the others at the start of train(): where the run stands (fresh or resumed).
struct DataParallelStart {
  int64_t step = 0, tokens_seen = 0, rows_drawn = 0;
  Generator::State sampler{};
  uint64_t draw_seed = 0;
};

class DataParallel {
 public:
  // `world` may be null (one process). Reads the test-only CORELM_TEST_PERTURB_REPLICA knob.
  DataParallel(const dist::World* world, std::vector<Tensor> params, const TrainOptions& options);
  ~DataParallel();
  bool enabled() const { return size_ > 1; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }

  // Rank 0's weights, optimizer moments and run position replace every other rank's (so --init,
  // --resume and seeded initialisation agree everywhere without each rank reading the checkpoint).
  void broadcast_start(std::vector<Tensor> params, std::vector<Tensor> exp_avg, std::vector<Tensor> exp_avg_sq,
                       DataParallelStart& start) const;

  // This rank's rows of a global micro-batch and the weight of its mean loss: its non-ignored
  // targets over the global batch's (0 when it has none: then it skips forward and backward).
  // Disabled: the whole batch with weight 1.
  struct Share {
    Batch local;
    double weight = 1;
    int64_t local_targets = 0;
  };
  Share take_rows(const Batch& global) const;

  // Reduces buckets as backward finishes their gradients while the returned scope lives (pass
  // true for the step's last micro-batch; earlier ones only accumulate). Null when disabled or
  // when overlap is off.
  std::unique_ptr<autograd::LeafGradHookScope> watch_backward(bool last_micro_batch);
  // Sums every parameter's gradient over the ranks: starts the buckets backward did not, waits for
  // all, writes the sums into .grad() (a parameter without a gradient contributes zeros).
  void reduce_gradients();
  // Seconds the last reduce_gradients() took: the communication backward did not hide, plus the
  // copies out of the buckets (the profile of a step: docs/SCALE-OUT.md).
  double last_reduce_seconds() const { return last_reduce_s_; }

  double sum(double value) const;
  // The largest of the ranks' values (stop decisions every rank must share).
  int64_t max(int64_t value) const;
  // After the optimizer update of `step`: the test knob's perturbation, then the checksum every
  // checksum_every steps, or now when `check_now`. ReplicasDiverged on a mismatch.
  void after_update(int64_t step, bool check_now);
  void check_replicas(int64_t step) const;

 private:
  void on_leaf_grad(const Tensor& leaf);
  void stage(size_t param);
  void launch_ready();
  void launch(size_t bucket);

  const dist::World* world_;
  int rank_ = 0, size_ = 1;
  std::vector<Tensor> params_;
  std::vector<GradientBucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> offset_of_;
  std::unordered_map<const void*, size_t> index_;
  std::vector<Tensor> buffers_;  // one f32 vector per bucket; the summed .grad()s are views into them
  std::vector<size_t> staged_count_;
  std::vector<char> staged_;
  std::vector<dist::PendingReduce> inflight_;
  size_t next_launch_ = 0;
  double last_reduce_s_ = 0;
  bool overlap_ = true;
  int64_t checksum_every_ = 0;
  int perturb_rank_ = -1;
  int64_t perturb_step_ = -1;
};

}  // namespace corelm::train
