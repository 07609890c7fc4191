// Learning-rate schedules. All start with a linear warmup; cosine then decays to
// lr * min_lr_ratio over the remaining steps; warmup-stable-decay (WSD) holds the peak and decays
// linearly over the last decay_fraction of the run.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "corelm/error.h"
#include "corelm/train.h"

namespace corelm::train {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "constant") return ScheduleKind::kConstant;
  if (name == "cosine") return ScheduleKind::kCosine;
  if (name == "wsd") return ScheduleKind::kWsd;
  throw ValueError("unknown schedule '" + name + "' (expected constant, cosine or wsd)");
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kConstant: return "constant";
    case ScheduleKind::kCosine: return "cosine";
    case ScheduleKind::kWsd: return "wsd";
  }
  return "?";
}

double Schedule::at(int64_t step) const {
  CORELM_CHECK(step >= 0, ValueError, "schedule: negative step ", step);
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double min_lr = lr * min_lr_ratio;
  const int64_t n = std::max<int64_t>(total, 1);
  switch (kind) {
    case ScheduleKind::kConstant:
      return lr;
    case ScheduleKind::kCosine: {
      const int64_t span = std::max<int64_t>(n - warmup, 1);
      const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
      return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
    }
    case ScheduleKind::kWsd: {
      const int64_t decay_steps = std::max<int64_t>(1, static_cast<int64_t>(std::llround(decay_fraction * n)));
      const int64_t decay_start = std::max(warmup, n - decay_steps);
      if (step < decay_start) return lr;
      const double progress =
          std::min(1.0, static_cast<double>(step - decay_start + 1) / static_cast<double>(n - decay_start));
      return lr + (min_lr - lr) * progress;
    }
  }
  return lr;
}

}  // namespace corelm::train
