#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace corelm::train {

std::vector<GradientBucket> plan_buckets(const std::vector<int64_t>& numels, int64_t bucket_bytes) {
  CORELM_CHECK(bucket_bytes >= 4, ValueError, "train: --bucket-kb must be positive, got ", bucket_bytes, " bytes");
  const int64_t cap = bucket_bytes / static_cast<int64_t>(sizeof(float));
  std::vector<GradientBucket> out;
  GradientBucket cur;
  for (size_t k = numels.size(); k-- > 0;) {
    CORELM_CHECK(numels[k] >= 0, ValueError, "plan_buckets: parameter ", k, " has ", numels[k], " elements");
    // A parameter that would overflow the bucket starts the next one: the tied embedding (the
    // largest gradient, final only at the very end of backward) then travels alone, and the
    // layer parameters before it are not held back waiting for it.
    if (!cur.params.empty() && cur.numel + numels[k] > cap) {
      out.push_back(std::move(cur));
      cur = GradientBucket{};
    }
    cur.params.push_back(k);
    cur.offsets.push_back(cur.numel);
    cur.numel += numels[k];
  }
  if (!cur.params.empty()) out.push_back(std::move(cur));
  return out;
}

uint64_t parameter_checksum(const std::vector<Tensor>& tensors) {
  // Word-at-a-time multiply-xorshift over the bits: any changed bit changes the hash with
  // overwhelming probability, at memory speed (the tiny preset's 6M floats take a few ms).
  uint64_t h = 0x9E3779B97F4A7C15ull;
  auto mix = [&h](uint64_t w) {
    h ^= w + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
  };
  for (const Tensor& t : tensors) {
    const Tensor c = t.contiguous();
    const unsigned char* p = static_cast<const unsigned char*>(static_cast<const void*>(c.data<float>()));
    const size_t n = c.nbytes();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    mix(tail ^ (static_cast<uint64_t>(n) << 56));
  }
  return h;
}

namespace {
// CORELM_TEST_PERTURB_REPLICA="RANK:STEP": after the update of STEP, rank RANK nudges one weight,
// as a faulty rank would; the tests use it to prove the checksum catches divergence. Read here
// only.
void read_perturb_knob(int& rank, int64_t& step) {
  const char* v = std::getenv("CORELM_TEST_PERTURB_REPLICA");
  if (!v || !*v) return;
  long r = -1;
  long long s = -1;
  CORELM_CHECK(std::sscanf(v, "%ld:%lld", &r, &s) == 2 && r >= 0 && s >= 1, ValueError,
               "CORELM_TEST_PERTURB_REPLICA must be RANK:STEP (e.g. 1:3), got '", v, "'");
  rank = static_cast<int>(r);
  step = s;
}
}  // namespace

DataParallel::DataParallel(const dist::World* world, std::vector<Tensor> params, const TrainOptions& options)
    : world_(world), params_(std::move(params)), overlap_(options.overlap_allreduce),
      checksum_every_(options.checksum_every) {
  if (!world_ || !world_->active()) return;
  rank_ = world_->rank();
  size_ = world_->size();
  if (!enabled()) return;
  read_perturb_knob(perturb_rank_, perturb_step_);
  std::vector<int64_t> numels;
  for (const Tensor& p : params_) numels.push_back(p.numel());
  buckets_ = plan_buckets(numels, options.bucket_bytes);
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t j = 0; j < buckets_[b].params.size(); ++j) {
      bucket_of_[buckets_[b].params[j]] = b;
      offset_of_[buckets_[b].params[j]] = buckets_[b].offsets[j];
    }
  for (size_t i = 0; i < params_.size(); ++i) index_[params_[i].id()] = i;
  for (const GradientBucket& b : buckets_) buffers_.push_back(Tensor::zeros({b.numel}));
  staged_count_.assign(buckets_.size(), 0);
  staged_.assign(params_.size(), 0);
  inflight_.resize(buckets_.size());
}

DataParallel::~DataParallel() = default;

void DataParallel::broadcast_start(std::vector<Tensor> params, std::vector<Tensor> exp_avg,
                                   std::vector<Tensor> exp_avg_sq, DataParallelStart& start) const {
  if (!enabled()) return;
  for (auto* list : {&params, &exp_avg, &exp_avg_sq})
    for (Tensor& t : *list) {
      CORELM_CHECK(t.is_contiguous() && t.dtype() == DType::F32, ValueError,
                   "data-parallel: parameters and optimizer state must be contiguous f32");
      world_->broadcast(t.data<float>(), t.nbytes());
    }
  world_->broadcast(&start, sizeof start);
}

DataParallel::Share DataParallel::take_rows(const Batch& global) const {
  Share s;
  if (!enabled()) {  // one process: the whole batch, weight 1 (local_targets is not counted)
    s.local = global;
    return s;
  }
  const std::vector<int64_t> targets = global.targets.to_int_vector();
  int64_t total = 0;
  for (int64_t t : targets) total += t != -100;
  const int64_t rows = global.ids.size(0);
  CORELM_CHECK(rows % size_ == 0, ValueError, "data-parallel: a global batch of ", rows, " rows for ", size_,
               " ranks");
  const int64_t per = rows / size_, cols = global.ids.size(1);
  s.local = Batch{global.ids.slice(0, rank_ * per, (rank_ + 1) * per).contiguous(),
                  global.targets.slice(0, rank_ * per, (rank_ + 1) * per).contiguous()};
  for (int64_t i = rank_ * per * cols; i < (rank_ + 1) * per * cols; ++i) s.local_targets += targets[i] != -100;
  s.weight = total > 0 ? static_cast<double>(s.local_targets) / static_cast<double>(total) : 0.0;
  return s;
}

std::unique_ptr<autograd::LeafGradHookScope> DataParallel::watch_backward(bool last_micro_batch) {
  if (!enabled() || !overlap_ || !last_micro_batch) return nullptr;
  return std::make_unique<autograd::LeafGradHookScope>([this](const Tensor& leaf) { on_leaf_grad(leaf); });
}

void DataParallel::on_leaf_grad(const Tensor& leaf) {
  const auto it = index_.find(leaf.id());
  if (it == index_.end() || staged_[it->second]) return;
  stage(it->second);
  launch_ready();
  // MPI progresses a non-blocking collective only inside MPI calls: poke the ones in flight.
  for (size_t b = 0; b < next_launch_; ++b) inflight_[b].test();
}

void DataParallel::stage(size_t param) {
  const size_t b = bucket_of_[param];
  float* dst = buffers_[b].data<float>() + offset_of_[param];
  const Tensor g = params_[param].grad();
  const size_t n = static_cast<size_t>(params_[param].numel());
  if (g.defined()) {
    const Tensor c = g.contiguous().to(DType::F32);
    std::memcpy(dst, c.data<float>(), n * sizeof(float));
  } else {
    std::memset(dst, 0, n * sizeof(float));
  }
  staged_[param] = 1;
  ++staged_count_[b];
}

// Buckets start in index order on every rank (MPI needs the same order of collectives everywhere),
// so a bucket finished early waits for the ones before it.
void DataParallel::launch_ready() {
  while (next_launch_ < buckets_.size() && staged_count_[next_launch_] == buckets_[next_launch_].params.size())
    launch(next_launch_++);
}

void DataParallel::launch(size_t b) {
  inflight_[b] = world_->iallreduce_sum(buffers_[b].data<float>(), static_cast<size_t>(buffers_[b].numel()));
}

void DataParallel::reduce_gradients() {
  if (!enabled()) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t b = next_launch_; b < buckets_.size(); ++b) {
    for (size_t p : buckets_[b].params)
      if (!staged_[p]) stage(p);
  }
  launch_ready();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    inflight_[b].wait();
    const GradientBucket& bucket = buckets_[b];
    // The sums become the gradients in place (no copy back): views into the bucket, which the
    // next step refills only after the optimizer has dropped them (zero_grad).
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      Tensor& p = params_[bucket.params[j]];
      p.set_grad(Tensor::from_storage(buffers_[b].storage(), p.shape(), DType::F32, bucket.offsets[j]));
    }
  }
  std::fill(staged_.begin(), staged_.end(), 0);
  std::fill(staged_count_.begin(), staged_count_.end(), 0);
  next_launch_ = 0;
  last_reduce_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double DataParallel::sum(double value) const {
  if (enabled()) world_->allreduce_sum(&value, 1);
  return value;
}

int64_t DataParallel::max(int64_t value) const {
  if (enabled()) world_->allreduce_max(&value, 1);
  return value;
}

void DataParallel::after_update(int64_t step, bool check_now) {
  if (!enabled()) return;
  if (rank_ == perturb_rank_ && step == perturb_step_ && !params_.empty() && params_[0].numel() > 0) {
    autograd::NoGradGuard no_grad;
    params_[0].data<float>()[0] += 1e-3f;
  }
  if (check_now || (checksum_every_ > 0 && step % checksum_every_ == 0)) check_replicas(step);
}

void DataParallel::check_replicas(int64_t step) const {
  if (!enabled()) return;
  const std::vector<uint64_t> all = world_->allgather(parameter_checksum(params_));
  std::vector<int> differ;
  for (int r = 1; r < size_; ++r)
    if (all[static_cast<size_t>(r)] != all[0]) differ.push_back(r);
  if (differ.empty()) return;
  std::ostringstream msg;
  msg << "train: the ranks' weights diverged at step " << step << ": the parameter checksum of rank"
      << (differ.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < differ.size(); ++i) msg << (i ? ", " : "") << differ[i];
  msg << " differs from rank 0's (" << std::hex;
  for (size_t i = 0; i < differ.size(); ++i) msg << "0x" << all[static_cast<size_t>(differ[i])] << " ";
  msg << "vs 0x" << all[0] << std::dec
      << "); identical updates must give identical weights, so a rank computed or stored something else (faulty "
         "memory, a different binary or CPU path). Nothing of this step was saved; --resume continues from the last "
         "checkpoint";
  throw ReplicasDiverged(msg.str());
}

}  // namespace corelm::train
